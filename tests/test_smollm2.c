/* test_smollm2.c - a real trained model end to end (issue 19): SmolLM2-135M-Instruct, converted by
 * ../shared/fixtures/real/smollm2/fetch.sh (tu_smollm2 finds it), against that folder's reference.json and
 * logits-k.f32, in float32 on sim, by the fixture README's rule:
 *   - every stored logits row within 1e-3 x max(1, max|ref row|), and the argmax of every row whose reference
 *     top-2 margin exceeds what that tolerance could close equal to row_argmax;
 *   - teacher-forced over all_ids through ppn_prefill (several chunks; one stage, and four stages on four sim
 *     devices) and token by token (the greedy runs' token-by-token feeds, which must follow all_ids);
 *   - free-running greedy ids equal to greedy_ids (EOS included) and their text to greedy_text, through one stage
 *     and four, the prompt primed in chunks and fed token by token (every row met on the way checked too);
 *   - `ppn run --prompt ... --chat` printing the reference answer, through 1 and 4 stages, and the README's main
 *     command's answer step as written there. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include "tests/util/tcheck.h"
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "tests/util/tutil.h"

#define TOL_F32 1e-3   /* the fixture README's float32 rule */
#define N_PROMPTS 3
#define MAX_NEW 64     /* the references' max_new_tokens */
#define EOS 2          /* <|im_end|> */

typedef struct ref_prompt {
    int *all, T, n_prompt;        /* all_ids = prompt_ids + greedy_ids */
    int *greedy, n_greedy;
    char *greedy_text;
    int *row_pos, n_rows;         /* the stored rows' positions (logits_rows) */
    float *logits;                /* [n_rows, vocab] */
    int *argmax;                  /* row_argmax, T entries */
    double *margin, *max_abs;     /* row_top2_margin, row_max_abs */
} ref_prompt;

static struct {
    const char *dir;
    ppn_rt *rt;
    ppn_model *m1, *m4;           /* one stage; four stages on sim devices 0..3 */
    ppn_tokenizer *tok;
    int vocab;
    ref_prompt p[N_PROMPTS];
    double worst;                 /* the largest max|x - ref| / bound over every row checked */
    int rows_checked;
} g;

static int *json_ints(json_t *a, int *n)
{
    *n = (int)json_array_size(a);
    int *v = malloc(sizeof(int) * (size_t)(*n ? *n : 1));
    for (int i = 0; v && i < *n; i++) v[i] = (int)json_integer_value(json_array_get(a, (size_t)i));
    return v;
}

static double *json_doubles(json_t *a)
{
    size_t n = json_array_size(a);
    double *v = malloc(sizeof(double) * (n ? n : 1));
    for (size_t i = 0; v && i < n; i++) v[i] = json_number_value(json_array_get(a, i));
    return v;
}

static void ref_load(void)
{
    json_error_t je;
    json_t *ref = json_load_file(tu_fixture("real/smollm2/reference.json"), 0, &je);
    if (!ref) fail_msg("reference.json: %s", je.text);
    json_t *prompts = json_object_get(ref, "prompts");
    assert_int_equal(json_array_size(prompts), N_PROMPTS);
    for (int k = 0; k < N_PROMPTS; k++) {
        json_t *o = json_array_get(prompts, (size_t)k);
        ref_prompt *p = &g.p[k];
        int n;
        free(json_ints(json_object_get(o, "prompt_ids"), &p->n_prompt));
        p->all = json_ints(json_object_get(o, "all_ids"), &p->T);
        p->greedy = json_ints(json_object_get(o, "greedy_ids"), &p->n_greedy);
        p->greedy_text = strdup(json_string_value(json_object_get(o, "greedy_text")));
        p->row_pos = json_ints(json_object_get(o, "logits_rows"), &p->n_rows);
        p->argmax = json_ints(json_object_get(o, "row_argmax"), &n);
        assert_int_equal(n, p->T);
        p->margin = json_doubles(json_object_get(o, "row_top2_margin"));
        p->max_abs = json_doubles(json_object_get(o, "row_max_abs"));
        char rel[128];
        snprintf(rel, sizeof rel, "real/smollm2/%s", json_string_value(json_object_get(o, "logits_file")));
        size_t bytes;
        p->logits = tu_read_file(tu_fixture(rel), &bytes);
        assert_non_null(p->logits);
        assert_int_equal(bytes, sizeof(float) * (size_t)p->n_rows * (size_t)g.vocab);
        assert_int_equal(p->T, p->n_prompt + p->n_greedy);
    }
    json_decref(ref);
}

static int group_setup(void **state)
{
    (void)state;
    memset(&g, 0, sizeof g);
    if (!(g.dir = tu_smollm2())) return 0;   /* PPN_SMOLLM2_UNAVAILABLE=1: every test skips */
    tu_env_set("PPN_SIM_DEVICES", "4");
    EXPECT_OK(ppn_rt_create("sim", &g.rt));
    tu_env_restore();
    ppn_load_opts lo = ppn_load_opts_default();
    lo.dtype = PPN_DTYPE_F32;
    lo.ctx = 256;   /* the longest reference is 116 positions: small KV pools */
    ppn_door shut = ppn_door_default(), four = ppn_door_default();
    four.n_stages = four.n_devices = 4;
    for (int s = 0; s < 4; s++) four.devices[s] = s;
    lo.door = &shut;
    g.m1 = tu_model_load(g.rt, g.dir, &lo);
    lo.door = &four;
    g.m4 = tu_model_load(g.rt, g.dir, &lo);
    ppn_stage_info si;
    ppn_model_get_stage_map(g.m4, &si);
    assert_int_equal(si.n_stages, 4);
    assert_int_equal(si.dev[3], 3);
    ppn_model_info mi;
    ppn_model_get_info(g.m1, &mi);
    assert_int_equal(mi.n_layers, 30);
    assert_int_equal(mi.eos_id, EOS);
    g.vocab = mi.vocab;
    assert_int_equal(g.vocab, 49152);
    EXPECT_OK(ppn_tokenizer_load(g.dir, &g.tok));
    ref_load();
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    for (int k = 0; k < N_PROMPTS; k++) {
        ref_prompt *p = &g.p[k];
        free(p->all), free(p->greedy), free(p->greedy_text), free(p->row_pos), free(p->logits);
        free(p->argmax), free(p->margin), free(p->max_abs);
    }
    ppn_tokenizer_free(g.tok);
    ppn_model_free(g.m1);
    ppn_model_free(g.m4);
    ppn_rt_destroy(g.rt);
    if (g.dir) print_message("smollm2: %d stored rows checked, worst %.3f of the f32 bound\n", g.rows_checked, g.worst);
    return 0;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The lowest index of the largest logit (ppn_sample's greedy rule). */
static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Row pos of prompt k (the logits after all_ids[0..pos]) against the reference: the stored row, if pos is one,
 * within the f32 rule; the argmax where the reference margin is wider than twice that rule's bound. */
static void check_row(int k, int pos, const float *x, const char *what)
{
    const ref_prompt *p = &g.p[k];
    double bound = TOL_F32 * fmax(1.0, p->max_abs[pos]);
    for (int r = 0; r < p->n_rows; r++) {
        if (p->row_pos[r] != pos) continue;
        const float *ref = p->logits + (size_t)r * (size_t)g.vocab;
        double worst = 0;
        int at = 0;
        for (int i = 0; i < g.vocab; i++) {
            double d = fabs((double)x[i] - (double)ref[i]);
            if (!(d <= worst)) worst = d, at = i;   /* NaN fails */
        }
        if (!(worst <= bound))
            fail_msg("%s: prompt %d row %d: |logit - ref| %.3g at id %d (%g vs %g) exceeds %.3g", what, k, pos, worst,
                     at, x[at], ref[at], bound);
        g.worst = fmax(g.worst, worst / bound);
        g.rows_checked++;
    }
    if (p->margin[pos] > 2 * bound && argmax(x, g.vocab) != p->argmax[pos])
        fail_msg("%s: prompt %d row %d: argmax %d, reference %d (margin %.3f)", what, k, pos, argmax(x, g.vocab),
                 p->argmax[pos], p->margin[pos]);
}

/* Feed ids[0..n) to s from position s0: primed chunk rows at a time, or (chunk 0) token by token; rows gets every
 * row's logits. */
static void feed(ppn_seq *s, const int *ids, int n, int chunk, float *rows)
{
    if (chunk > 0) {
        ppn_prefill_opts po = {.chunk = chunk, .all_logits = 1};
        EXPECT_OK(ppn_prefill(s, ids, n, &po, rows));
        return;
    }
    for (int t = 0; t < n; t++) EXPECT_OK(ppn_decode_step(s, ids[t], rows + (size_t)t * (size_t)g.vocab));
}

/* Teacher-forced: all_ids of prompt k fed to m (chunk as feed takes it), every row checked. */
static void teacher_forced(ppn_model *m, int k, int chunk, const char *what)
{
    const ref_prompt *p = &g.p[k];
    float *rows = malloc(sizeof(float) * (size_t)p->T * (size_t)g.vocab);
    assert_non_null(rows);
    ppn_seq *s = NULL;
    EXPECT_OK(ppn_seq_create(m, &s));
    double t0 = now_s();
    feed(s, p->all, p->T, chunk, rows);
    print_message("%s: prompt %d: %d rows in %.1f s\n", what, k, p->T, now_s() - t0);
    for (int t = 0; t < p->T; t++) check_row(k, t, rows + (size_t)t * (size_t)g.vocab, what);
    ppn_seq_destroy(s);
    free(rows);
}

/* Free-running greedy on m: prompt k's ids fed (chunk, or token by token), then up to MAX_NEW ids, each the
 * argmax of the row before it, fed in turn (the EOS too, so the reference's last row is met); every row checked,
 * the ids equal to greedy_ids and their text to greedy_text. */
static void greedy(ppn_model *m, int k, int chunk, const char *what)
{
    const ref_prompt *p = &g.p[k];
    float *rows = malloc(sizeof(float) * (size_t)p->n_prompt * (size_t)g.vocab);
    assert_non_null(rows);
    ppn_seq *s = NULL;
    EXPECT_OK(ppn_seq_create(m, &s));
    double t0 = now_s();
    feed(s, p->all, p->n_prompt, chunk, rows);
    double t1 = now_s();
    for (int t = 0; t < p->n_prompt; t++) check_row(k, t, rows + (size_t)t * (size_t)g.vocab, what);
    float *x = rows + (size_t)(p->n_prompt - 1) * (size_t)g.vocab;
    int gen[MAX_NEW], n = 0;
    while (n < MAX_NEW) {
        gen[n] = argmax(x, g.vocab);
        if (n >= p->n_greedy || gen[n] != p->greedy[n])
            fail_msg("%s: prompt %d: greedy id %d is %d, reference %d", what, k, n, gen[n],
                     n < p->n_greedy ? p->greedy[n] : -1);
        EXPECT_OK(ppn_decode_step(s, gen[n], x));
        check_row(k, p->n_prompt + n, x, what);
        if (gen[n++] == EOS) break;
    }
    assert_int_equal(n, p->n_greedy);
    print_message("%s: prompt %d: %d prompt ids in %.1f s, %d ids in %.1f s\n", what, k, p->n_prompt, t1 - t0, n,
                  now_s() - t1);
    char text[4096];
    size_t len;
    EXPECT_OK(ppn_detokenize(g.tok, gen, n, text, sizeof text, &len));
    assert_string_equal(text, p->greedy_text);
    ppn_seq_destroy(s);
    free(rows);
}

static void test_smollm2_teacher_forced(void **state)
{
    (void)state;
    if (!g.dir) skip();
    for (int k = 0; k < N_PROMPTS; k++) teacher_forced(g.m1, k, 32, "1 stage, chunks of 32");
    teacher_forced(g.m4, 2, PPN_PREFILL_CHUNK, "4 stages, one chunk");
    /* Token by token: test_smollm2_greedy's token-by-token runs feed all_ids one id at a time (its ids must equal
     * greedy_ids, so that feed is the teacher-forced one: the 45 rows of prompt 0 through 1 and 4 stages, the 90
     * of prompt 1 through 1, the 116 of prompt 2 through 4), checking every row as teacher_forced does. */
}

/* Each prompt through both stage counts and both prompt paths at least once; prompt 0 (8 new ids) through all
 * four pairs. */
static void test_smollm2_greedy(void **state)
{
    (void)state;
    if (!g.dir) skip();
    greedy(g.m1, 0, PPN_PREFILL_CHUNK, "greedy 1 stage, chunked");
    greedy(g.m1, 0, 0, "greedy 1 stage, token by token");
    greedy(g.m4, 0, PPN_PREFILL_CHUNK, "greedy 4 stages, chunked");
    greedy(g.m4, 0, 0, "greedy 4 stages, token by token");
    greedy(g.m1, 1, 0, "greedy 1 stage, token by token");
    greedy(g.m4, 1, PPN_PREFILL_CHUNK, "greedy 4 stages, chunked");
    greedy(g.m1, 2, 16, "greedy 1 stage, chunks of 16");
    greedy(g.m4, 2, 0, "greedy 4 stages, token by token");
}

#define ANSWER "The capital of France is Paris.\n"   /* greedy_text of prompt 0 without <|im_end|> */

static void expect_answer(const char *env, const char *args)
{
    char *out = NULL, *err = NULL;
    int rc = tu_run_ppn(env, args, &out, &err, NULL);
    if (rc || !out || strcmp(out, ANSWER))
        fail_msg("'%s ppn %s': exit %d, stdout \"%s\" (want \"%s\"), stderr: %s", env, args, rc, out ? out : "",
                 ANSWER, err ? err : "");
    free(out), free(err);
}

/* `ppn run --prompt --chat`: exactly the reference answer, through one stage, four on one device and four on four
 * sim devices; --json's ids are greedy_ids, EOS included. */
static void test_smollm2_cli(void **state)
{
    (void)state;
    if (!g.dir) skip();
    ppn_template *tp = NULL;   /* how run finds the end of a turn: ChatML's <|im_end|>, the config's EOS too */
    EXPECT_OK(ppn_template_load(g.dir, &tp));
    assert_int_equal(ppn_template_end_of_turn(tp, g.tok), EOS);
    ppn_template_free(tp);
    char args[8192];
    const char *stages[] = {"", "--stages 4", "--stages 4 --devices 0,1,2,3"};
    for (int i = 0; i < 3; i++) {
        snprintf(args, sizeof args, "run --backend sim --model '%s' --prompt 'What is the capital of France?' --chat "
                 "-n 64 %s", g.dir, stages[i]);
        expect_answer("", args);
    }
    snprintf(args, sizeof args, "run --backend sim --model '%s' --prompt 'What is the capital of France?' --chat "
             "-n 64 --json --chunk 0", g.dir);
    char *out = NULL, *err = NULL;
    assert_int_equal(tu_run_ppn("", args, &out, &err, NULL), 0);
    json_t *j = json_loads(out, 0, NULL), *ids = json_object_get(j, "ids");
    if (!j) fail_msg("--json: %s", out);
    assert_int_equal(json_array_size(ids), g.p[0].n_greedy);
    for (int i = 0; i < g.p[0].n_greedy; i++)
        assert_int_equal(json_integer_value(json_array_get(ids, (size_t)i)), g.p[0].greedy[i]);
    assert_string_equal(json_string_value(json_object_get(j, "text")), "The capital of France is Paris.");
    assert_true(json_is_true(json_object_get(j, "stopped")));
    json_decref(j);
    free(out), free(err);
}

/* The README's main command: the line that fetches the model into .whl/smollm2 (tools/smollm2_fetch.sh) and
 * answers with `build/ppn run`.
 * Its answer step is run as written (build/ppn and .whl/smollm2 pointed at this build and checkpoint) on sim, and
 * must print the stage map of 4 stages, the reference answer and the speed. */
static void test_smollm2_readme_command(void **state)
{
    (void)state;
    if (!g.dir) skip();
    const char *src = getenv("PPN_SRC");
    if (!src || !*src) fail_msg("PPN_SRC is not set (ctest sets it to the source tree)");
    char path[4096];
    snprintf(path, sizeof path, "%s/README.md", src);
    size_t n;
    char *readme = tu_read_file(path, &n), *line = NULL;
    assert_non_null(readme);
    for (char *l = strtok(readme, "\n"); l && !line; l = strtok(NULL, "\n"))
        if (strstr(l, "tools/smollm2_fetch.sh") && strstr(l, "build/ppn run --model .whl/smollm2")) line = l;
    if (!line) fail_msg("README.md has no main command line running tools/smollm2_fetch.sh and build/ppn run");
    char *run = strstr(line, "build/ppn run") + strlen("build/ppn "), args[8192];
    size_t k = 0;
    for (const char *r = run; *r && k < sizeof args - 4096; r++) {   /* .whl/smollm2 -> the checkpoint */
        if (!strncmp(r, ".whl/smollm2", 12)) k += (size_t)snprintf(args + k, sizeof args - k, "'%s'", g.dir), r += 11;
        else args[k++] = *r;
    }
    args[k] = 0;
    assert_non_null(strstr(args, "--stages 4"));
    char *out = NULL, *err = NULL;
    int rc = tu_run_ppn("PPN_BACKEND=sim", args, &out, &err, NULL);
    if (rc || strcmp(out, ANSWER) || !strstr(err, "stage map: 4 stages") || !strstr(err, "tok/s"))
        fail_msg("README's 'ppn %s': exit %d, stdout \"%s\", stderr: %s", args, rc, out, err);
    free(out), free(err);
    free(readme);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_smollm2_teacher_forced),
        cmocka_unit_test(test_smollm2_greedy),
        cmocka_unit_test(test_smollm2_cli),
        cmocka_unit_test(test_smollm2_readme_command),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

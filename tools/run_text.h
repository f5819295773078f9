/* run_text.h - `ppn run --prompt TEXT [--chat] [--system TEXT]`: text in through the checkpoint's tokenizer (and
 * chat template), text out through the streaming detokenizer, stopping at the end tokens (tools/run_text.c). */
#ifndef PPN_RUN_TEXT_H
#define PPN_RUN_TEXT_H

#include <stddef.h>
#include <stdio.h>
#include "ppn.h"

#define RUN_TEXT_MAX_STOP 4

typedef struct run_text {
    ppn_tokenizer *tok;
    ppn_detok_stream *ds;
    int stop[RUN_TEXT_MAX_STOP]; /* the ids that end generation (see run_text_open) */
    int n_stop;
    int to_stdout;               /* stream each id's text to stdout; else keep it in buf (--json) */
    char *buf;                   /* the text so far, without the end token */
    size_t len, cap;
} run_text;

/* Load the tokenizer beside model (the folder model names, or the folder holding the file it names) and make the
 * prompt's ids (*ids malloc'd): with chat, system (may be NULL) and prompt as messages through the checkpoint's
 * chat template with the generation prompt, tokenized without added special tokens (apply_chat_template's rule);
 * else prompt tokenized with the special tokens the tokenizer's config adds (BOS or not). The stop ids: the
 * tokenizer config's eos_token and the chat template's end of turn (ppn_template_end_of_turn; without chat only
 * when the checkpoint has a template); the model config's eos id joins them through run_text_add_stop. 0, or 1 after the message (no tokenizer there: the checkpoint
 * takes --ids; no chat template; a tokenizer or template failure). */
int run_text_open(run_text *t, const char *model, const char *prompt, const char *system, int chat, int to_stdout,
                  int **ids, int *n_ids);
/* Add id (ignored when negative or already there) to the stop ids. */
void run_text_add_stop(run_text *t, int id);
/* 1 when id ends generation. */
int run_text_is_stop(const run_text *t, int id);
/* One generated id (not a stop id): its text streamed (stdout, flushed) or kept. 0, or 1 after the message. */
int run_text_push(run_text *t, int id);
/* The end: whatever the detokenizer holds, then (streaming) a newline. 0, or 1 after the message. */
int run_text_finish(run_text *t);
/* The stop ids as a JSON list and the kept text as a JSON string, e.g. "stop_ids":[2],"text":"..." */
void run_text_json(const run_text *t, FILE *f);
void run_text_close(run_text *t);

#endif

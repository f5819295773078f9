/* fuzz_template.c - a chat template's source through ppn_template_parse (tmpl_parse.c: tokens, the tree, the
 * subset check), then, when it parses, rendered (tmpl_eval.c) over a messages list: the part of the input after
 * its first NUL byte when there is one (any JSON: render_json must refuse what is not a list of objects), else a
 * fixed conversation with system, user, assistant and tool turns. */
#include "ppn.h"
#include "fuzz_util.h"

static const char k_msgs[] =
    "[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Hi \\u00e9 <s>\"},"
    "{\"role\":\"assistant\",\"content\":\"Hello!\",\"tool_calls\":[{\"function\":{\"name\":\"f\","
    "\"arguments\":{\"x\":1}}}]},{\"role\":\"tool\",\"content\":\"42\"},{\"role\":\"user\",\"content\":\"\"}]";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *msgs;
    size_t src_len, msgs_len;
    fz_split(data, size, &msgs, &src_len, &msgs_len);
    ppn_template *t = NULL;
    if (ppn_template_parse((const char *)data, src_len, "fuzz", &t) != PPN_OK) return 0;
    char *m = msgs ? strndup((const char *)msgs, msgs_len) : NULL, *out = NULL;
    ppn_template_render_json(t, m ? m : k_msgs, "{\"bos_token\":\"<s>\",\"eos_token\":\"</s>\"}", 1, &out);
    free(out);
    const ppn_chat_msg plain[] = {{"user", "q"}, {"assistant", NULL}, {NULL, "a"}};
    out = NULL;
    ppn_template_render(t, plain, 3, 0, &out);
    free(out);
    free(m);
    ppn_template_free(t);
    return 0;
}

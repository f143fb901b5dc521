/* g4 serve's request parser and reply writer (tools/serve/request.c, reply.c), without HTTP or the
 * model's weights (the built-in model's tokenizer only):
 *  - requests: every field read into what the engine runs (roles, content parts, tool calls as the
 *    model writes them, tool responses put in their calls' order by tool_call_id, sampling with the
 *    fields it set, stop strings, thinking), and every refusal with its status, OpenAI-style error
 *    and parameter;
 *  - prompts: the chat rendering's tokens (g4_chat_encode's), a named tool_choice's opened call,
 *    raw prompts, and the context check (prompt plus budget);
 *  - replies: over token sequences from encoded texts, the streamed deltas join to the tokens'
 *    decode (an independent whole-text reference), a stop string cuts exactly where strstr finds it
 *    in that text wherever the tokens split it, thoughts go to reasoning_content, tool calls become
 *    JSON, and each event is "data: JSON" ending with [DONE]. */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include "cli.h"
#include "serve/reply.h"
#include "serve/request.h"

#define TOKENIZER "models/gemma4-tiny-math/tokenizer.json"

static g4_tokenizer *tok;
static const serve_limits LIM = {.model_id = "m", .strict_model = 1, .ctx = 256, .max_messages = 8, .max_tools = 2, .max_stop = 4, .max_stop_len = 16,
                                 .max_json_values = 4096, .max_n = 2, .vocab = 100};

static int parse(const char *body, serve_kind kind, serve_request *r, serve_error *e) {
    return serve_parse_request(body, strlen(body), kind, &LIM, r, e);
}

/* ---------------------------------------------------------------- requests */

static void check_refusal(const char *body, serve_kind kind, int status, const char *param, const char *code) {
    serve_request r;
    serve_error e;
    int rc = parse(body, kind, &r, &e);
    CHECK(rc != 0 && e.status == status && !strcmp(e.param, param) && (code ? e.code && !strcmp(e.code, code) : !e.code) && e.message[0] &&
              !strchr(e.message, '\n'),
          "%s: rc %d status %d param '%s' code %s: %s", body, rc, e.status, e.param, e.code ? e.code : "null", e.message);
    char *json = rc ? serve_error_json(&e) : NULL;
    cJSON *j = json ? cJSON_Parse(json) : NULL, *err = cJSON_GetObjectItem(j, "error");
    CHECK(cJSON_GetArraySize(err) == 4 && cJSON_IsString(cJSON_GetObjectItem(err, "message")) && cJSON_IsString(cJSON_GetObjectItem(err, "type")) &&
              (param[0] ? cJSON_IsString(cJSON_GetObjectItem(err, "param")) : cJSON_IsNull(cJSON_GetObjectItem(err, "param"))),
          "%s: the error object %s", body, json ? json : "-");
    cJSON_Delete(j);
    free(json);
}

static void check_refusals(void) {
    struct {
        const char *body;
        serve_kind kind;
        int status;
        const char *param, *code;
    } cases[] = {
        {"{", SERVE_CHAT, 400, "", NULL},
        {"[]", SERVE_CHAT, 400, "", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\x28\"}]}", SERVE_CHAT, 400, "", "invalid_utf8"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000\"}]}", SERVE_CHAT, 400, "", NULL},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", SERVE_CHAT, 400, "model", NULL},
        {"{\"model\":\"other\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", SERVE_CHAT, 404, "model", "model_not_found"},
        {"{\"model\":\"m\",\"messages\":{}}", SERVE_CHAT, 400, "messages", NULL},
        {"{\"model\":\"m\",\"messages\":[]}", SERVE_CHAT, 400, "messages", NULL},
        {"{\"model\":\"m\",\"messages\":[1]}", SERVE_CHAT, 400, "messages[0]", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"model\",\"content\":\"x\"}]}", SERVE_CHAT, 400,
         "messages[1].role", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":7,\"content\":\"x\"}]}", SERVE_CHAT, 400, "messages[0].role", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"parallel_tool_calls\":\"no\"}", SERVE_CHAT, 400,
         "parallel_tool_calls", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_audio\"}]}]}", SERVE_CHAT, 400,
         "messages[0].content[0]", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}", SERVE_CHAT, 400, "messages[0].content[0]", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":\"[1]\"}}]}]}",
         SERVE_CHAT, 400, "messages[0].tool_calls[0]", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"arguments\":\"{}\"}}]}]}", SERVE_CHAT, 400,
         "messages[0].tool_calls[0]", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"tool\",\"content\":\"1\"}]}", SERVE_CHAT, 400, "messages",
         NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":-1}", SERVE_CHAT, 400, "temperature", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_p\":0}", SERVE_CHAT, 400, "top_p", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_k\":1.5}", SERVE_CHAT, 400, "top_k", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"seed\":-3}", SERVE_CHAT, 400, "seed", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"presence_penalty\":2.5}", SERVE_CHAT, 400, "presence_penalty", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"frequency_penalty\":-2.1}", SERVE_CHAT, 400, "frequency_penalty", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":3}", SERVE_CHAT, 400, "top_logprobs", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":21}", SERVE_CHAT, 400,
         "top_logprobs", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":3}", SERVE_CHAT, 400, "logprobs", NULL},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"logprobs\":21}", SERVE_COMPLETION, 400, "logprobs", NULL},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"logprobs\":true}", SERVE_COMPLETION, 400, "logprobs", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logit_bias\":{\"5\":101}}", SERVE_CHAT, 400, "logit_bias", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logit_bias\":{\"-5\":1}}", SERVE_CHAT, 400, "logit_bias", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logit_bias\":{\"5x\":1}}", SERVE_CHAT, 400, "logit_bias", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logit_bias\":{\"5\":\"1\"}}", SERVE_CHAT, 400, "logit_bias", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logit_bias\":[1]}", SERVE_CHAT, 400, "logit_bias", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":257}", SERVE_CHAT, 400, "max_tokens",
         "context_length_exceeded"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":\"9\"}", SERVE_CHAT, 400,
         "max_completion_tokens", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":7}", SERVE_CHAT, 400, "stop", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"a\",2]}", SERVE_CHAT, 400, "stop[1]", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":\"seventeen bytes!!\"}", SERVE_CHAT, 400, "stop", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":3}", SERVE_CHAT, 400, "n", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":1}", SERVE_CHAT, 400, "stream", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":true,\"stream_options\":[]}", SERVE_CHAT, 400,
         "stream_options", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logit_bias\":{\"100\":1}}", SERVE_CHAT, 400, "logit_bias", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":{\"enable_thinking\":\"yes\"}}",
         SERVE_CHAT, 400, "chat_template_kwargs.enable_thinking", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"retrieval\"}]}", SERVE_CHAT, 400, "tools[0]",
         NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{}}]}", SERVE_CHAT,
         400, "tools[0]", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"required\"}", SERVE_CHAT, 400, "tool_choice",
         NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"sometimes\"}", SERVE_CHAT, 400, "tool_choice",
         NULL},
        {"{\"model\":\"m\"}", SERVE_COMPLETION, 400, "prompt", NULL},
        {"{\"model\":\"m\",\"prompt\":\"\"}", SERVE_COMPLETION, 400, "prompt", NULL},
        {"{\"model\":\"m\",\"prompt\":[\"a\",\"b\"]}", SERVE_COMPLETION, 400, "prompt", NULL},
        {"{\"model\":\"m\",\"prompt\":[1,-2]}", SERVE_COMPLETION, 400, "prompt", NULL},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"best_of\":2}", SERVE_COMPLETION, 400, "best_of", NULL},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"suffix\":\"y\"}", SERVE_COMPLETION, 400, "suffix", NULL},
        /* constrained decoding (issue 36): malformed fields, two at once, and tools with a constraint
         * are refused by name, never ignored */
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"grammar\":7}", SERVE_CHAT, 400, "grammar", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"json_schema\":[1]}", SERVE_CHAT, 400, "json_schema", NULL},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"guided_choice\":[]}", SERVE_COMPLETION, 400, "guided_choice", NULL},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"guided_choice\":[\"a\",1]}", SERVE_COMPLETION, 400, "guided_choice", NULL},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"guided_regex\":\"\"}", SERVE_COMPLETION, 400, "guided_regex", NULL},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"guided_json\":{},\"guided_regex\":\"a\"}", SERVE_COMPLETION, 400, "guided_regex", NULL},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"response_format\":{\"type\":\"json_object\"},\"grammar\":\"root ::= \\\"a\\\"\"}", SERVE_COMPLETION, 400, "grammar", NULL},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"response_format\":{\"type\":\"xml\"}}", SERVE_COMPLETION, 400, "response_format.type", NULL},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\"}}", SERVE_COMPLETION, 400, "response_format.json_schema", NULL},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\"}}}", SERVE_COMPLETION, 400,
         "response_format.json_schema.schema", NULL},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{},\"strict\":1}}}", SERVE_COMPLETION,
         400, "response_format.json_schema.strict", NULL},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"structured_outputs\":{\"xml\":1}}", SERVE_COMPLETION, 400, "structured_outputs", NULL},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"structured_outputs\":{}}", SERVE_COMPLETION, 400, "structured_outputs", NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
         "\"response_format\":{\"type\":\"json_object\"}}", SERVE_CHAT, 400, "response_format", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) check_refusal(cases[i].body, cases[i].kind, cases[i].status, cases[i].param, cases[i].code);
    /* the limits: messages, tools */
    char body[4096] = "{\"model\":\"m\",\"messages\":[";
    for (int i = 0; i < 9; i++) strcat(body, i ? ",{\"role\":\"user\",\"content\":\"q\"}" : "{\"role\":\"user\",\"content\":\"q\"}");
    strcat(body, "]}");
    check_refusal(body, SERVE_CHAT, 400, "messages", NULL);
    const char *tool = "{\"type\":\"function\",\"function\":{\"name\":\"f\"}}";
    snprintf(body, sizeof body, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[%s,%s,%s]}", tool, tool, tool);
    check_refusal(body, SERVE_CHAT, 400, "tools", NULL);
    printf("ok %zu refused requests, each with its status, parameter and code\n", sizeof cases / sizeof *cases + 2);
}

static void check_fields(void) {
    serve_request r;
    serve_error e;
    const char *body =
        "{\"model\":\"m\",\"temperature\":0.5,\"top_p\":0.9,\"top_k\":-1,\"min_p\":0.1,\"seed\":77,\"repetition_penalty\":1.2,\"max_tokens\":9,"
        "\"frequency_penalty\":0,\"stop\":[\"##\",\"\\n\\n\"],\"stream\":true,\"stream_options\":{\"include_usage\":true},\"reasoning_effort\":\"low\","
        "\"unknown_field\":{\"ignored\":true},\"user\":\"u\",\"messages\":["
        "{\"role\":\"developer\",\"content\":\"be brief\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\" a \"},{\"type\":\"text\",\"text\":\"b\"}]},"
        "{\"role\":\"assistant\",\"content\":\"ok\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":"
        "\"{\\\"x\\\":1}\"}},{\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c2\",\"content\":\"G\"},{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"F\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"d\"}}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}";
    int rc = parse(body, SERVE_CHAT, &r, &e);
    CHECK(rc == 0, "a full request: %s", e.message);
    if (rc) return;
    CHECK(r.sampling.temperature == 0.5f && r.sampling.top_p == 0.9f && r.sampling.top_k == 0 && r.sampling.min_p == 0.1f &&
              r.sampling.repeat_penalty == 1.2f && r.sampling.seed == 77 && r.seed_given && r.max_tokens == 9,
          "sampling and budget read");
    CHECK(r.sampling_given == (G4_SAMPLE_TEMP | G4_SAMPLE_TOP_P | G4_SAMPLE_TOP_K | G4_SAMPLE_MIN_P | G4_SAMPLE_PENALTY | G4_SAMPLE_FREQUENCY),
          "the fields given: %d",
          r.sampling_given);
    CHECK(r.n_stop == 2 && !strcmp(r.stop[0], "##") && !strcmp(r.stop[1], "\n\n") && r.stream && r.include_usage && r.thinking, "stop, stream, thinking");
    CHECK(r.n_msgs == 5 && r.msgs[0].role == G4_CHAT_SYSTEM && r.msgs[1].role == G4_CHAT_USER && !strcmp(r.msgs[1].content, "ab"),
          "developer is system; text parts trimmed and joined: '%s'", r.n_msgs > 1 ? r.msgs[1].content : "");
    CHECK(r.n_msgs == 5 && r.msgs[2].role == G4_CHAT_MODEL &&
              !strcmp(r.msgs[2].content, "<|tool_call>call:f{x:1}<tool_call|><|tool_call>call:g{}<tool_call|>ok"),
          "an assistant's tool calls written as the model writes them, before its text: '%s'", r.n_msgs > 2 ? r.msgs[2].content : "");
    CHECK(r.n_msgs == 5 && !strcmp(r.msgs[3].content, "F") && !strcmp(r.msgs[4].content, "G"), "tool responses in their calls' order");
    CHECK(r.n_tools == 1 && !strcmp(r.tools[0], "declaration:f{description:<|\"|>d<|\"|>}") && r.tool_choice == SERVE_TOOLS_NAMED &&
              !strcmp(r.tool_name, "f"),
          "tools declared in Gemma's syntax, the named choice");
    serve_request_free(&r);
    CHECK(parse("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":{\"enable_thinking\":false},"
                "\"reasoning_effort\":\"high\",\"max_tokens\":null,\"stop\":null}",
                SERVE_CHAT, &r, &e) == 0 &&
              !r.thinking && r.max_tokens == -1 && r.n_stop == 0 && r.sampling_given == 0 && !r.seed_given,
          "enable_thinking wins over reasoning_effort; null is not given: %s", e.message);
    serve_request_free(&r);
    /* OpenAI's generation fields: n, penalties, logit_bias (ids to biases), logprobs in both forms */
    CHECK(parse("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":2,\"frequency_penalty\":-0.5,"
                "\"presence_penalty\":1.5,\"logit_bias\":{\"7\":-100,\"99\":2.5},\"logprobs\":true,\"top_logprobs\":20}",
                SERVE_CHAT, &r, &e) == 0 &&
              r.n == 2 && r.sampling.frequency_penalty == -0.5f && r.sampling.presence_penalty == 1.5f && r.sampling.n_bias == 2 &&
              r.sampling.bias_ids[0] == 7 && r.sampling.bias_values[0] == -100 && r.sampling.bias_ids[1] == 99 && r.sampling.bias_values[1] == 2.5f &&
              r.logprobs && r.top_logprobs == 20 && (r.sampling_given & G4_SAMPLE_BIAS),
          "n, penalties, logit_bias, logprobs read: %s", e.message);
    serve_request_free(&r);
    CHECK(parse("{\"model\":\"m\",\"prompt\":\"x\",\"logprobs\":0}", SERVE_COMPLETION, &r, &e) == 0 && r.logprobs && r.top_logprobs == 0 && r.n == 1,
          "completions' logprobs 0: the chosen tokens' only: %s", e.message);
    serve_request_free(&r);
    CHECK(parse("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":false}", SERVE_CHAT, &r, &e) == 0 &&
              !r.logprobs,
          "logprobs false: %s", e.message);
    serve_request_free(&r);
    CHECK(parse("{\"model\":\"m\",\"prompt\":[2,5,9]}", SERVE_COMPLETION, &r, &e) == 0 && r.n_prompt_ids == 3 && r.prompt_ids[2] == 9 && !r.prompt,
          "a prompt of token ids");
    serve_request_free(&r);
    CHECK(parse("{\"model\":\"m\",\"prompt\":[\"hello\"]}", SERVE_COMPLETION, &r, &e) == 0 && r.prompt && !strcmp(r.prompt, "hello"),
          "a prompt of one string in an array");
    serve_request_free(&r);
}

/* ---------------------------------------------------------------- prompts */

static void check_prompts(void) {
    serve_request r;
    serve_error e;
    int32_t *ids = NULL, *want = NULL;
    int n, opens, budget;
    char *prefill = NULL;
    size_t n_want;
    CHECK(parse("{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":\"2+2?\"}]}", SERVE_CHAT, &r, &e) == 0,
          "%s", e.message);
    int rc = serve_prompt(&r, tok, G4_CHAT_FORM_E2B, (int)g4_tokenizer_vocab_size(tok), &LIM, &ids, &n, &opens, &prefill, &budget, &e);
    g4_chat_options o = g4_chat_default_options();
    CHECK(rc == 0 && g4_chat_encode(tok, r.msgs, r.n_msgs, &o, &want, &n_want) == 0 && (size_t)n == n_want &&
              !memcmp(ids, want, sizeof *ids * n_want) && !prefill && !opens && budget == LIM.ctx - n + 1,
          "a chat prompt is g4_chat_encode's; the budget is the rest of the context (%d)", budget);
    free(ids), free(want), ids = NULL, want = NULL;
    /* the server's default budget (--max-tokens) when it is less than the context leaves */
    serve_limits lim = LIM;
    lim.max_tokens = 10;
    rc = serve_prompt(&r, tok, G4_CHAT_FORM_E2B, (int)g4_tokenizer_vocab_size(tok), &lim, &ids, &n, &opens, &prefill, &budget, &e);
    CHECK(rc == 0 && budget == 10, "--max-tokens 10: a chat reply's default budget is %d", budget);
    free(ids), ids = NULL;
    serve_request_free(&r);
    CHECK(parse("{\"model\":\"m\",\"prompt\":\"x\"}", SERVE_COMPLETION, &r, &e) == 0, "%s", e.message);
    rc = serve_prompt(&r, tok, G4_CHAT_FORM_E2B, (int)g4_tokenizer_vocab_size(tok), &LIM, &ids, &n, &opens, &prefill, &budget, &e);
    CHECK(rc == 0 && budget == SERVE_DEFAULT_COMPLETION_TOKENS, "a completion's default budget is OpenAI's 16, not %d", budget);
    free(ids), ids = NULL;
    serve_request_free(&r);
    /* a named tool: the call opened after the generation prompt */
    CHECK(parse("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"w\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
                "\"get_w\"}}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_w\"}}}",
                SERVE_CHAT, &r, &e) == 0,
          "%s", e.message);
    rc = serve_prompt(&r, tok, G4_CHAT_FORM_E2B, (int)g4_tokenizer_vocab_size(tok), &LIM, &ids, &n, &opens, &prefill, &budget, &e);
    char *text = NULL;
    size_t len = 0;
    CHECK(rc == 0 && prefill && !strcmp(prefill, "<|tool_call>call:get_w") && g4_tokenizer_decode(tok, ids, (size_t)n, &text, &len) == 0 &&
              len > strlen(prefill) && !strcmp(text + len - strlen(prefill), prefill) && strstr(text, "<|turn>model\n<|tool_call>"),
          "tool_choice names a function: the prompt ends with its call opened: %s", text ? text : e.message);
    /* the rest of the call constrained: its arguments (no parameters: "{}") and the close */
    CHECK(serve_tool_constraint(&r, tok, 1, &e) == 0 && r.constraint_kind == G4_CONSTRAINT_GBNF && !strcmp(r.constraint_param, "tool_choice") &&
              strstr(r.constraint_text, "root ::= (\"{}\") <["),
          "tool_choice names a function: the call's grammar: %s", r.constraint_text ? r.constraint_text : e.message);
    free(text), free(ids), free(prefill), ids = NULL, prefill = NULL;
    serve_request_free(&r);
    /* tool_choice auto: a strict function constrains the whole reply (text, then calls); without one, nothing */
    for (int strict = 0; strict < 2; strict++) {
        char body[400];
        snprintf(body, sizeof body,
                 "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"w\"}],\"tools\":[{\"type\":\"function\","
                 "\"function\":{\"name\":\"get_w\",\"strict\":%s,\"parameters\":{\"type\":\"object\",\"properties\":{\"c\":"
                 "{\"type\":\"string\"}}}}}]}", strict ? "true" : "false");
        CHECK(parse(body, SERVE_CHAT, &r, &e) == 0, "%s", e.message);
        CHECK(serve_tool_constraint(&r, tok, 0, &e) == 0 &&
                  (strict ? r.constraint_kind == G4_CONSTRAINT_GBNF && !strcmp(r.constraint_param, "tools") &&
                                strstr(r.constraint_text, "\"<\"* (<[")
                          : r.constraint_kind < 0 && !r.constraint_text),
              "tool_choice auto, strict %d: the constraint %s", strict, r.constraint_text ? r.constraint_text : e.message);
        serve_request_free(&r);
    }
    /* a parameters schema the compiler refuses: 400 naming that tool's parameters */
    CHECK(parse("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"w\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
                "\"a\"}},{\"type\":\"function\",\"function\":{\"name\":\"b\",\"parameters\":{\"type\":\"object\",\"properties\":{\"x\":{\"if\":{}}}}}}],"
                "\"tool_choice\":\"required\"}",
                SERVE_CHAT, &r, &e) == 0,
          "%s", e.message);
    CHECK(serve_tool_constraint(&r, tok, 1, &e) != 0 && e.status == 400 && !strcmp(e.param, "tools[1].function.parameters") && strstr(e.message, "'if'"),
          "tool_choice required over a schema with 'if': %d %s %s", e.status, e.param, e.message);
    serve_request_free(&r);
    /* raw: the text's own control tokens, no BOS added */
    CHECK(parse("{\"model\":\"m\",\"prompt\":\"<|turn>user\\nhi\",\"max_tokens\":5}", SERVE_COMPLETION, &r, &e) == 0, "%s", e.message);
    rc = serve_prompt(&r, tok, G4_CHAT_FORM_E2B, (int)g4_tokenizer_vocab_size(tok), &LIM, &ids, &n, &opens, &prefill, &budget, &e);
    CHECK(rc == 0 && g4_tokenizer_encode(tok, "<|turn>user\nhi", 14, 1, &want, &n_want) == 0 && (size_t)n == n_want &&
              !memcmp(ids, want, sizeof *ids * n_want) && budget == 5,
          "a raw prompt is encoded with its control tokens");
    free(ids), free(want), ids = NULL, want = NULL;
    serve_request_free(&r);
    /* the context: prompt plus max_tokens, and a prompt alone */
    char body[8192];
    snprintf(body, sizeof body, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"%0*d\"}],\"max_tokens\":200}", 60, 0);
    CHECK(parse(body, SERVE_CHAT, &r, &e) == 0, "%s", e.message);
    rc = serve_prompt(&r, tok, G4_CHAT_FORM_E2B, (int)g4_tokenizer_vocab_size(tok), &LIM, &ids, &n, &opens, &prefill, &budget, &e);
    CHECK(rc != 0 && e.status == 400 && e.code && !strcmp(e.code, "context_length_exceeded") && !ids, "prompt + max_tokens past the context: %s",
          e.message);
    serve_request_free(&r);
    /* without max_tokens the reply would take what the prompt leaves: past the context, the
     * message counts the prompt alone (it reported a negative completion, issue 33) */
    int at = snprintf(body, sizeof body, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"");
    for (int i = 0; i < 300; i++) at += snprintf(body + at, sizeof body - (size_t)at, "seven ");
    snprintf(body + at, sizeof body - (size_t)at, "\"}]}");
    CHECK(parse(body, SERVE_CHAT, &r, &e) == 0, "%s", e.message);
    rc = serve_prompt(&r, tok, G4_CHAT_FORM_E2B, (int)g4_tokenizer_vocab_size(tok), &LIM, &ids, &n, &opens, &prefill, &budget, &e);
    CHECK(rc != 0 && e.code && !strcmp(e.code, "context_length_exceeded") && strstr(e.message, "maximum context length is 256 tokens. However, your "
          "messages resulted in ") && !strchr(e.message, '-'), "a prompt past the context without max_tokens: %s", e.message);
    serve_request_free(&r);
    CHECK(parse("{\"model\":\"m\",\"prompt\":[2,99999]}", SERVE_COMPLETION, &r, &e) == 0, "%s", e.message);
    rc = serve_prompt(&r, tok, G4_CHAT_FORM_E2B, (int)g4_tokenizer_vocab_size(tok), &LIM, &ids, &n, &opens, &prefill, &budget, &e);
    CHECK(rc != 0 && e.status == 400 && strstr(e.message, "99999"), "a token outside the vocabulary: %s", e.message);
    serve_request_free(&r);
}

/* ---------------------------------------------------------------- replies */

typedef struct {
    char content[4096], reasoning[4096], calls[4096], finish[32];
    int events, done, role_first, bad_event;
    cJSON *whole;
} outcome;

/* Reads the SSE events of a streamed reply (or the whole body) and joins what they carry. */
static void read_output(const char *out, int stream, outcome *o) {
    memset(o, 0, sizeof *o);
    if (!stream) {
        o->whole = cJSON_Parse(out);
        return;
    }
    for (const char *p = out; *p;) {
        const char *end = strstr(p, "\n\n");
        if (strncmp(p, "data: ", 6) != 0 || !end) {
            o->bad_event++;
            break;
        }
        char *ev = strndup(p + 6, (size_t)(end - p - 6));
        p = end + 2;
        if (!strcmp(ev, "[DONE]")) {
            o->done = !*p;
            free(ev);
            break;
        }
        cJSON *j = cJSON_Parse(ev), *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), *d = cJSON_GetObjectItem(ch, "delta");
        if (!j) o->bad_event++;
        if (o->events++ == 0) o->role_first = cJSON_IsString(cJSON_GetObjectItem(d, "role"));
        const cJSON *c = cJSON_GetObjectItem(d, "content"), *rs = cJSON_GetObjectItem(d, "reasoning_content"), *t = cJSON_GetObjectItem(ch, "text"),
                    *f = cJSON_GetObjectItem(ch, "finish_reason"), *calls = cJSON_GetObjectItem(d, "tool_calls");
        if (cJSON_IsString(c)) strncat(o->content, c->valuestring, sizeof o->content - strlen(o->content) - 1);
        if (cJSON_IsString(t)) strncat(o->content, t->valuestring, sizeof o->content - strlen(o->content) - 1);
        if (cJSON_IsString(rs)) strncat(o->reasoning, rs->valuestring, sizeof o->reasoning - strlen(o->reasoning) - 1);
        for (const cJSON *k = calls ? calls->child : NULL; k; k = k->next) {
            const cJSON *fn = cJSON_GetObjectItem(k, "function");
            snprintf(o->calls + strlen(o->calls), sizeof o->calls - strlen(o->calls), "%s%s", cJSON_GetObjectItem(fn, "name")->valuestring,
                     cJSON_GetObjectItem(fn, "arguments")->valuestring);
        }
        if (cJSON_IsString(f)) snprintf(o->finish, sizeof o->finish, "%s", f->valuestring);
        cJSON_Delete(j);
        free(ev);
    }
}

/* The reply to text's tokens, pushed one token at a time; stop: the id ending it (-1 none). */
static void run_reply(const char *text, const serve_reply_config *c, int32_t stop_id, int max_tokens, outcome *o, int *stopped_at) {
    int32_t *ids;
    size_t n;
    g4_textbuf out = {0};
    CHECK(g4_tokenizer_encode(tok, text, strlen(text), 1, &ids, &n) == 0, "%s", g4_last_error());
    serve_reply *r = serve_reply_new(tok, c, &out);
    CHECK(r != NULL, "serve_reply_new");
    int end = -1;
    size_t k = 0;
    for (; r && k < n && (int)k < max_tokens && end < 0; k++)
        if (serve_reply_token(r, ids[k], 0, &out) == 1) end = (int)k;
    if (r && end < 0 && stop_id >= 0 && (int)k < max_tokens) serve_reply_token(r, stop_id, 1, &out), k++;
    if (r) serve_reply_finish(r, (int)k >= max_tokens && end < 0 ? SERVE_FINISH_LENGTH : SERVE_FINISH_STOP, 10, 3, (int)k, &out);
    read_output(out.p ? out.p : "", c->stream, o);
    if (stopped_at) *stopped_at = end;
    serve_reply_free(r);
    free(out.p);
    free(ids);
}

static serve_reply_config config(serve_kind kind, int stream) {
    return (serve_reply_config){.kind = kind, .stream = stream, .include_usage = 1, .id = "chatcmpl-1", .model = "m", .created = 1};
}

static void check_replies(void) {
    const char *text = "12*3=36.\n36+5=41.\n#### 41\nThe final answer is 41 \xc3\xa9\xe6\x97\xa5";
    int32_t eos = 1;
    /* streamed chat: the deltas join to the text */
    serve_reply_config c = config(SERVE_CHAT, 1);
    outcome o;
    run_reply(text, &c, eos, 1000, &o, NULL);
    CHECK(!strcmp(o.content, text) && o.role_first && o.done && !o.bad_event && !strcmp(o.finish, "stop"), "streamed chat: '%s' finish %s",
          o.content, o.finish);
    /* every stop string, at every place: cut exactly before strstr's match, however the tokens split it */
    static const char *const stops[] = {"=", "36", "\n#", "41.\n#", "answer is", "\xe6\x97\xa5", "is 41 \xc3\xa9"};
    for (size_t s = 0; s < sizeof stops / sizeof *stops; s++)
        for (int stream = 0; stream < 2; stream++) {
            char *const list[] = {(char *)"never", (char *)stops[s]};
            c = config(SERVE_CHAT, stream);
            c.stop = list, c.n_stop = 2;
            run_reply(text, &c, eos, 1000, &o, NULL);
            size_t at = (size_t)(strstr(text, stops[s]) - text);
            const char *got = stream ? o.content : cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o.whole, "choices"), 0),
                                                                                            "message"),
                                                                         "content")
                                                       ->valuestring;
            CHECK(strlen(got) == at && !strncmp(got, text, at), "stop '%s' (stream %d): '%s'", stops[s], stream, got);
            cJSON_Delete(o.whole);
        }
    /* a stop string that never comes releases everything held back at the end */
    char *const held[] = {(char *)"\xc3\xa9\xe6\x97\xa5X"};
    c = config(SERVE_CHAT, 1);
    c.stop = held, c.n_stop = 1;
    run_reply(text, &c, eos, 1000, &o, NULL);
    CHECK(!strcmp(o.content, text), "a held-back partial stop string is released at the end: '%s'", o.content);
    /* the budget: finish_reason length */
    run_reply(text, &c, eos, 4, &o, NULL);
    CHECK(!strcmp(o.finish, "length") && strlen(o.content) > 0 && !strncmp(text, o.content, strlen(o.content)), "budget: '%s' %s", o.content, o.finish);
    /* thoughts and calls */
    c = config(SERVE_CHAT, 1);
    c.tools = 1;
    run_reply("<|channel>thought\nweigh it<channel|>Sure. <|tool_call>call:f{a:<|\"|>x y<|\"|>,b:[1,2]}<tool_call|>", &c, eos, 1000, &o, NULL);
    CHECK(!strcmp(o.reasoning, "weigh it") && !strcmp(o.content, "Sure. ") && !strcmp(o.calls, "f{\"a\":\"x y\",\"b\":[1,2]}") &&
              !strcmp(o.finish, "tool_calls"),
          "a thought, text and a call: reasoning '%s' content '%s' calls '%s' finish %s", o.reasoning, o.content, o.calls, o.finish);
    c.stream = 0;
    run_reply("<|tool_call>call:f{a:1}<tool_call|>", &c, eos, 1000, &o, NULL);
    cJSON *msg = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o.whole, "choices"), 0), "message");
    cJSON *call = cJSON_GetArrayItem(cJSON_GetObjectItem(msg, "tool_calls"), 0);
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(msg, "content")) && cJSON_IsString(cJSON_GetObjectItem(call, "id")) &&
              !strcmp(cJSON_GetObjectItem(cJSON_GetObjectItem(call, "function"), "arguments")->valuestring, "{\"a\":1}"),
          "a whole reply of one call: content null, the call with its id and JSON arguments");
    cJSON *usage = cJSON_GetObjectItem(o.whole, "usage");
    CHECK(cJSON_GetObjectItem(usage, "prompt_tokens")->valueint == 10 && cJSON_GetObjectItem(usage, "total_tokens")->valueint ==
              10 + cJSON_GetObjectItem(usage, "completion_tokens")->valueint &&
              cJSON_GetObjectItem(cJSON_GetObjectItem(usage, "prompt_tokens_details"), "cached_tokens")->valueint == 3,
          "usage");
    cJSON_Delete(o.whole);
    /* a call that cannot be parsed, and one never closed, are text */
    c.stream = 1;
    run_reply("A <|tool_call>nonsense<tool_call|> B <|tool_call>call:f{a:", &c, eos, 1000, &o, NULL);
    CHECK(!strcmp(o.content, "A <|tool_call>nonsense<tool_call|> B <|tool_call>call:f{a:") && !o.calls[0] && !strcmp(o.finish, "stop"),
          "unparsable and unclosed calls stay text: '%s'", o.content);
    /* the opened call of a named tool_choice completes with the model's text */
    c.prefill = "<|tool_call>call:get_w{";
    run_reply("city:<|\"|>Oslo<|\"|>}<tool_call|>", &c, eos, 1000, &o, NULL);
    CHECK(!strcmp(o.calls, "get_w{\"city\":\"Oslo\"}"), "the prefilled call: '%s'", o.calls);
    /* parallel_tool_calls false: the reply ends at its first call (the stream stops there, the
     * second call never reaches the client); true (OpenAI's default) keeps both */
    c.prefill = NULL;
    const char *two_calls = "<|tool_call>call:f{a:1}<tool_call|><|tool_call>call:g{b:2}<tool_call|>";
    int stopped_at;
    for (int one = 0; one < 2; one++) {
        c.one_call = one;
        run_reply(two_calls, &c, eos, 1000, &o, &stopped_at);
        CHECK(!strcmp(o.calls, one ? "f{\"a\":1}" : "f{\"a\":1}g{\"b\":2}") && !strcmp(o.finish, "tool_calls") && (one ? stopped_at > 0 : stopped_at < 0) &&
                  !o.content[0],
              "one_call %d: calls '%s' finish %s stopped at %d content '%s'", one, o.calls, o.finish, stopped_at, o.content);
    }
    c.one_call = 0;
    /* text completions: the decoded text, markers included */
    c = config(SERVE_COMPLETION, 1);
    run_reply("<|channel>x<channel|> y", &c, eos, 1000, &o, NULL);
    CHECK(!strcmp(o.content, "<|channel>x<channel|> y") && !strcmp(o.finish, "stop") && o.done, "a text completion streams its text: '%s'", o.content);
}

/* g4 serve's transport fields: any model name without --strict-model, cache_salt, the JSON
 * value bound (counted by hand in the worked examples). */
static void check_transport_fields(void) {
    serve_limits open = LIM;
    open.strict_model = 0;
    for (int v = 0; v < 2; v++) { /* parallel_tool_calls read as given; true when absent */
        char body[160];
        snprintf(body, sizeof body, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]%s}",
                 v ? ",\"parallel_tool_calls\":false" : "");
        serve_request r;
        serve_error e;
        CHECK(serve_parse_request(body, strlen(body), SERVE_CHAT, &open, &r, &e) == 0 && r.one_call == v, "%s: one_call %d", body, r.one_call);
        serve_request_free(&r);
    }
    const char *names[] = {"{\"model\":\"gpt-3.5-turbo\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}"};
    for (int i = 0; i < 2; i++) {
        serve_request r;
        serve_error e;
        CHECK(serve_parse_request(names[i], strlen(names[i]), SERVE_CHAT, &open, &r, &e) == 0, "without --strict-model: %s: %s", names[i], e.message);
        serve_request_free(&r);
    }
    serve_request r;
    serve_error e;
    const char *salted = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"cache_salt\":\"alice\"}";
    CHECK(parse(salted, SERVE_CHAT, &r, &e) == 0 && r.cache_salt && !strcmp(r.cache_salt, "alice") && r.api_key == 0, "cache_salt read");
    serve_request_free(&r);
    check_refusal("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"cache_salt\":\"\"}", SERVE_CHAT, 400, "cache_salt", NULL);
    check_refusal("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"cache_salt\":5}", SERVE_CHAT, 400, "cache_salt", NULL);
    /* 1 + the '[', ',' and ':' outside strings: 1 + 1 + 3 + 2 (a member counts its ',' and its ':',
     * an upper bound); an escaped quote does not end a string */
    const char *six = "{\"a\":[1,2,3],\"b\":\"x,y:[z\"}", *four = "[\"a\\\"\", 1, 2]";
    CHECK(serve_json_values(six, strlen(six)) == 7 && serve_json_values(four, strlen(four)) == 4, "serve_json_values: %zu %zu",
          serve_json_values(six, strlen(six)), serve_json_values(four, strlen(four)));
    char *big = malloc(3 * 4096 + 128);
    size_t n = (size_t)sprintf(big, "{\"model\":\"m\",\"prompt\":[");
    for (int i = 0; i < 4096; i++) n += (size_t)sprintf(big + n, "%s1", i ? "," : "");
    strcpy(big + n, "]}");
    check_refusal(big, SERVE_COMPLETION, 413, "", "request_too_large");
    free(big);
}

/* Each field that asks for a constraint is read into the request (kind, text, the field's name):
 * OpenAI's response_format (json_object, json_schema), llama.cpp's grammar and json_schema,
 * vLLM's guided_* and structured_outputs; text and none leave no constraint. */
static void check_constraints(void) {
    static const struct {
        const char *fields;
        serve_kind kind;
        int want_kind;
        const char *text, *param;
    } cases[] = {
        {"\"response_format\":{\"type\":\"text\"}", SERVE_CHAT, -1, NULL, ""},
        {"\"response_format\":{\"type\":\"json_object\"}", SERVE_CHAT, G4_CONSTRAINT_JSON_OBJECT, "", "response_format"},
        {"\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\",\"strict\":true,\"schema\":{\"type\":\"integer\"}}}",
         SERVE_CHAT, G4_CONSTRAINT_JSON_SCHEMA, "{\"type\":\"integer\"}", "response_format.json_schema.schema"},
        {"\"grammar\":\"root ::= \\\"a\\\"\"", SERVE_CHAT, G4_CONSTRAINT_GBNF, "root ::= \"a\"", "grammar"},
        {"\"json_schema\":{\"enum\":[1,2]}", SERVE_COMPLETION, G4_CONSTRAINT_JSON_SCHEMA, "{\"enum\":[1,2]}", "json_schema"},
        {"\"guided_json\":\"{\\\"type\\\":\\\"null\\\"}\"", SERVE_COMPLETION, G4_CONSTRAINT_JSON_SCHEMA, "{\"type\":\"null\"}", "guided_json"},
        {"\"guided_regex\":\"[a-z]+\"", SERVE_COMPLETION, G4_CONSTRAINT_REGEX, "[a-z]+", "guided_regex"},
        {"\"guided_grammar\":\"root ::= [0-9]\"", SERVE_COMPLETION, G4_CONSTRAINT_GBNF, "root ::= [0-9]", "guided_grammar"},
        {"\"guided_choice\":[\"yes\",\"no \\\"x\\\\\\n\"]", SERVE_CHAT, G4_CONSTRAINT_GBNF, "root ::= \"yes\" | \"no \\\"x\\\\\\x0A\"", "guided_choice"},
        {"\"structured_outputs\":{\"choice\":[\"a\"]}", SERVE_COMPLETION, G4_CONSTRAINT_GBNF, "root ::= \"a\"", "structured_outputs.choice"},
        {"\"structured_outputs\":{\"json_object\":true}", SERVE_COMPLETION, G4_CONSTRAINT_JSON_OBJECT, "", "structured_outputs.json_object"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"none\",\"guided_regex\":\"a\"", SERVE_CHAT,
         G4_CONSTRAINT_REGEX, "a", "guided_regex"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char body[1024];
        snprintf(body, sizeof body, "{\"model\":\"m\",%s,%s}",
                 cases[i].kind == SERVE_CHAT ? "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]" : "\"prompt\":\"x\"", cases[i].fields);
        serve_request r;
        serve_error e;
        int rc = parse(body, cases[i].kind, &r, &e);
        CHECK(rc == 0, "%s: %s", body, e.message);
        if (rc) continue;
        CHECK(r.constraint_kind == cases[i].want_kind && !strcmp(r.constraint_param, cases[i].param) &&
                  (cases[i].text ? r.constraint_text && !strcmp(r.constraint_text, cases[i].text) : !r.constraint_text),
              "%s: kind %d, param '%s', text %s", body, r.constraint_kind, r.constraint_param, r.constraint_text ? r.constraint_text : "(none)");
        /* what it parsed to compiles (the server's 400 for what does not: tests/serve) */
        g4_grammar *g = NULL;
        if (r.constraint_kind == G4_CONSTRAINT_GBNF) g = g4_grammar_compile(r.constraint_text, strlen(r.constraint_text));
        else if (r.constraint_kind == G4_CONSTRAINT_JSON_SCHEMA) g = g4_grammar_from_json_schema(r.constraint_text, strlen(r.constraint_text));
        else if (r.constraint_kind == G4_CONSTRAINT_REGEX) g = g4_grammar_from_regex(r.constraint_text, strlen(r.constraint_text));
        CHECK(r.constraint_kind < 0 || r.constraint_kind == G4_CONSTRAINT_JSON_OBJECT || g, "%s: %s", body, g4_last_error());
        g4_grammar_free(g);
        serve_request_free(&r);
    }
    printf("ok constraint fields\n");
}

/* Media parts (issue 35): data: URLs and input_audio decoded as RFC 4648 base64 (padding optional,
 * the RFC's test vectors), each part's message, kind, budget and field; bad base64 refused. */
static void check_media_parts(void) {
    static const char *const vectors[][2] = {{"Zg==", "f"}, {"Zm8=", "fo"}, {"Zm9v", "foo"}, {"Zm9vYg", "foob"}, {"Zm9vYmE=", "fooba"}, {"Zm9vYmFy", "foobar"}};
    serve_limits lim = LIM;
    lim.max_media = 3;
    for (size_t i = 0; i < sizeof vectors / sizeof *vectors; i++) {
        char body[512];
        snprintf(body, sizeof body,
                 "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                 "\"text\":\"q\"},{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,%s\",\"detail\":\"low\"}},"
                 "{\"type\":\"input_audio\",\"input_audio\":{\"data\":\"%s\",\"format\":\"wav\"}}]}]}",
                 vectors[i][0], vectors[i][0]);
        serve_request r;
        serve_error e;
        int rc = serve_parse_request(body, strlen(body), SERVE_CHAT, &lim, &r, &e);
        CHECK(rc == 0 && r.n_media == 2, "%s: %s", vectors[i][0], rc ? e.message : "two parts");
        if (rc) continue;
        size_t n = strlen(vectors[i][1]);
        for (int k = 0; k < 2; k++)
            CHECK(r.media[k].msg == 1 && r.media[k].len == n && !memcmp(r.media[k].bytes, vectors[i][1], n), "%s: part %d decodes to %.*s", vectors[i][0], k,
                  (int)r.media[k].len, (const char *)r.media[k].bytes);
        CHECK(r.media[0].kind == G4_MEDIA_IMAGE && r.media[0].budget == 70 && !strcmp(r.media[0].param, "messages[1].content[1].image_url.url") &&
                  r.media[1].kind == G4_MEDIA_AUDIO && !strcmp(r.media[1].param, "messages[1].content[2].input_audio.data") && !strcmp(r.msgs[1].content, "q"),
              "%s: the parts' kinds, budget and fields", vectors[i][0]);
        serve_request_free(&r);
    }
    const char *bad[] = {"Z", "Zm9=v", "Zm9v!", "Zm 9v", ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char body[512];
        snprintf(body, sizeof body, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,%s\"}}]}]}",
                 bad[i]);
        serve_request r;
        serve_error e;
        int rc = serve_parse_request(body, strlen(body), SERVE_CHAT, &lim, &r, &e);
        CHECK(rc != 0 && e.status == 400 && !strcmp(e.param, "messages[0].content[0].image_url.url"), "base64 '%s': rc %d %s", bad[i], rc, e.message);
    }
    printf("ok media parts: base64 per RFC 4648 (6 vectors, 5 refusals), kinds, budget and fields\n");
}


int main(void) {
    g4_set_log(NULL, NULL);
    tok = g4_tokenizer_load_ex(TOKENIZER, G4_TOKENIZER_NO_CACHE);
    CHECK(tok != NULL, "%s", g4_last_error());
    if (!tok) return check_report("test_serve");
    check_refusals();
    check_constraints();
    check_transport_fields();
    check_fields();
    check_prompts();
    check_replies();
    check_media_parts();
    g4_tokenizer_free(tok);
    return check_report("test_serve");
}

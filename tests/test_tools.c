/* Tools between OpenAI's JSON and Gemma's tool syntax (src/text/tools.c):
 *  - declarations and calls against the real upstream E2B template run through Jinja2
 *    (tests/fixtures/chat/tool_cases.jsonl, made by make_tool_cases.py): every schema feature the
 *    template reads (enum, nullable, items, nested objects, an object without properties, a type
 *    list, a response) and every argument type (numbers as Python prints them, nesting, unicode);
 *  - a call the template renders, parsed back, gives the arguments it was rendered from;
 *  - the parser on what a model may write besides (spaces, JSON strings, bare words) and what it
 *    refuses (unclosed strings, missing colons, text after the arguments, deep nesting), each
 *    refusal a one-line message;
 *  - a declaration the converter writes, rendered into a prompt, is the template's system turn. */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#define CASES "tests/fixtures/chat/tool_cases.jsonl"

static int one_line(const char *msg) { return msg && *msg && !strchr(msg, '\n'); }

/* The text of a call between "{" after its name and its closing marker, i.e. g4_tool_call.arguments. */
static char *call_arguments(const char *call_text) {
    g4_chat_reply r;
    char *args = NULL;
    if (g4_chat_parse_reply(call_text, strlen(call_text), &r) == 0 && r.n_tool_calls == 1) args = strdup(r.tool_calls[0].arguments);
    g4_chat_reply_free(&r);
    return args;
}

static void check_declaration(const cJSON *row) {
    const char *name = cJSON_GetObjectItem(row, "name")->valuestring, *want = cJSON_GetObjectItem(row, "text")->valuestring;
    char *json = cJSON_PrintUnformatted(cJSON_GetObjectItem(row, "tool")), *got = NULL;
    int rc = g4_tool_declaration(json, strlen(json), &got);
    CHECK(rc == 0, "declaration \"%s\": %s", name, g4_last_error());
    if (rc == 0) CHECK(strcmp(got, want) == 0, "declaration \"%s\":\n   got  %s\n   want %s", name, got, want);
    free(got);
    free(json);
}

static void check_call(const cJSON *row) {
    const char *name = cJSON_GetObjectItem(row, "name")->valuestring, *want = cJSON_GetObjectItem(row, "text")->valuestring;
    const cJSON *args = cJSON_GetObjectItem(row, "arguments");
    char *json = cJSON_PrintUnformatted(args), *got = NULL, *back = NULL;
    int rc = g4_tool_call_text(cJSON_GetObjectItem(row, "function")->valuestring, json, strlen(json), &got);
    CHECK(rc == 0, "call \"%s\": %s", name, g4_last_error());
    if (rc == 0) CHECK(strcmp(got, want) == 0, "call \"%s\":\n   got  %s\n   want %s", name, got, want);
    /* the template's text (not ours) parsed back */
    char *gemma = call_arguments(want);
    CHECK(gemma != NULL, "call \"%s\": g4_chat_parse_reply found no call in the template's text", name);
    if (gemma) {
        rc = g4_tool_arguments_json(gemma, strlen(gemma), &back);
        CHECK(rc == 0, "call \"%s\": parsing %s: %s", name, gemma, g4_last_error());
        cJSON *parsed = rc == 0 ? cJSON_Parse(back) : NULL;
        CHECK(parsed && cJSON_Compare(parsed, args, 1), "call \"%s\": %s parsed to %s, not %s", name, gemma, back ? back : "-", json);
        cJSON_Delete(parsed);
    }
    free(gemma);
    free(back);
    free(got);
    free(json);
}

static void check_fixture(void) {
    char *text;
    CHECK(g4_read_file(CASES, &text, NULL) == 0, "cannot read %s", CASES);
    if (!text) return;
    int n_decl = 0, n_call = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *row = cJSON_Parse(line);
        CHECK(row != NULL, "%s: a line is not JSON", CASES);
        if (!row) continue;
        const char *kind = cJSON_GetObjectItem(row, "kind")->valuestring;
        if (!strcmp(kind, "declaration")) check_declaration(row), n_decl++;
        else check_call(row), n_call++;
        cJSON_Delete(row);
    }
    free(text);
    CHECK(n_decl >= 15 && n_call >= 8, "%s: %d declarations and %d calls (expected at least 15 and 8)", CASES, n_decl, n_call);
    printf("ok %d declarations and %d calls as the template renders them\n", n_decl, n_call);
}

/* What a model may write, and the JSON it must give. */
static void check_parse(const char *gemma, const char *want_json) {
    char *got = NULL;
    int rc = g4_tool_arguments_json(gemma, strlen(gemma), &got);
    cJSON *g = rc == 0 ? cJSON_Parse(got) : NULL, *w = cJSON_Parse(want_json);
    CHECK(rc == 0 && g && cJSON_Compare(g, w, 1), "%s -> %s, want %s (%s)", gemma, got ? got : "error", want_json, rc ? g4_last_error() : "");
    cJSON_Delete(g);
    cJSON_Delete(w);
    free(got);
}

static void check_refused(const char *gemma, const char *why) {
    char *got = NULL;
    int rc = g4_tool_arguments_json(gemma, strlen(gemma), &got);
    CHECK(rc != 0 && got == NULL, "%s (%s) was accepted: %s", gemma, why, got ? got : "");
    CHECK(rc == 0 || one_line(g4_last_error()), "%s: the message is not one line", gemma);
    free(got);
}

static void check_parser(void) {
    check_parse("{}", "{}");
    check_parse(" { a : 1 , b : <|\"|>x y<|\"|> } ", "{\"a\":1,\"b\":\"x y\"}");
    check_parse("{<|\"|>odd key<|\"|>:true}", "{\"odd key\":true}");
    check_parse("{s:\"json \\\"string\\\"\\n\"}", "{\"s\":\"json \\\"string\\\"\\n\"}");
    check_parse("{\"k\":null}", "{\"k\":null}");
    check_parse("{city:Paris,n:-12.5e3,t:false}", "{\"city\":\"Paris\",\"n\":-12500,\"t\":false}");
    check_parse("{list:[1,[2,[]],{x:<|\"|>}{],:<|\"|>}]}", "{\"list\":[1,[2,[]],{\"x\":\"}{],:\"}]}");
    check_parse("{word:1e,v:inf}", "{\"word\":\"1e\",\"v\":\"inf\"}");
    check_parse("{text:<|\"|>a <tool_call|> b<|\"|>}", "{\"text\":\"a <tool_call|> b\"}");
    check_refused("", "empty");
    check_refused("[1]", "not an object");
    check_refused("{a:<|\"|>open}", "unclosed string");
    check_refused("{a:\"open}", "unclosed JSON string");
    check_refused("{a 1}", "no colon");
    check_refused("{a:1", "unclosed object");
    check_refused("{a:[1,2}", "unclosed array");
    check_refused("{a:}", "no value");
    check_refused("{a:1} trailing", "text after");
    check_refused("{a:1,,b:2}", "empty member");
    char deep[400] = "{a:";
    for (int i = 0; i < 70; i++) strcat(deep, "[");
    check_refused(deep, "nested past the limit");
    /* whole calls: name and JSON, markers in strings are text */
    char *name = NULL, *json = NULL;
    const char *call = "<|tool_call>call:say{text:<|\"|>a <channel|> b <|channel>c<|\"|>}<tool_call|>";
    CHECK(g4_tool_call_parse(call, strlen(call), &name, &json) == 0 && !strcmp(name, "say") && !strcmp(json, "{\"text\":\"a <channel|> b <|channel>c\"}"),
          "a call with markers in its string: %s %s", name ? name : g4_last_error(), json ? json : "");
    free(name), free(json);
    static const char *const not_calls[] = {"<|tool_call>call:{a:1}<tool_call|>", "<|tool_call>f{a:1}<tool_call|>", "<|tool_call>call:f{a:1}",
                                            "call:f{a:1}<tool_call|>", "<|tool_call>call:f<tool_call|>", "<|tool_call>call:f{a:}<tool_call|>"};
    for (size_t i = 0; i < sizeof not_calls / sizeof *not_calls; i++) {
        name = json = NULL;
        CHECK(g4_tool_call_parse(not_calls[i], strlen(not_calls[i]), &name, &json) != 0 && !name && !json && one_line(g4_last_error()),
              "not a call, accepted: %s", not_calls[i]);
    }
    char *out = NULL;
    CHECK(g4_tool_declaration("{\"function\":{}}", 15, &out) != 0 && one_line(g4_last_error()), "a function without a name was accepted");
    free(out), out = NULL;
    CHECK(g4_tool_declaration("{nope", 5, &out) != 0 && one_line(g4_last_error()), "a tool that is not JSON was accepted");
    free(out), out = NULL;
    CHECK(g4_tool_call_text("f", "[1]", 3, &out) != 0 && !out, "arguments that are no object were accepted");
    CHECK(g4_tool_call_text("f", "", 0, &out) == 0 && out && !strcmp(out, "<|tool_call>call:f{}<tool_call|>"), "empty arguments: %s",
          out ? out : g4_last_error());
    free(out), out = NULL;
    CHECK(g4_tool_call_text("f", " null ", 6, &out) == 0 && out && !strcmp(out, "<|tool_call>call:f{}<tool_call|>"), "null arguments: %s",
          out ? out : g4_last_error());
    free(out), out = NULL;
    CHECK(g4_tool_call_text("", "{}", 2, &out) != 0, "a call without a name was accepted");
    free(out);
}

/* The template_cases.jsonl case "tools declared" gives the template's whole prompt for the
 * weather and sum tools: the declarations made here, rendered by g4, must give that text. */
static void check_rendered_prompt(void) {
    static const char *weather = "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"The weather in a city now.\","
                                 "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"description\":\"The city.\"}},"
                                 "\"required\":[\"city\"]}}}";
    static const char *sum = "{\"type\":\"function\",\"function\":{\"name\":\"add\",\"description\":\"Adds two numbers.\",\"parameters\":{\"type\":"
                             "\"object\",\"properties\":{\"a\":{\"type\":\"number\"},\"b\":{\"type\":\"number\"}},\"required\":[\"a\",\"b\"]}}}";
    char *text, *want = NULL;
    CHECK(g4_read_file("tests/fixtures/chat/template_cases.jsonl", &text, NULL) == 0, "cannot read template_cases.jsonl");
    if (!text) return;
    for (char *line = strtok(text, "\n"); line && !want; line = strtok(NULL, "\n")) {
        cJSON *row = cJSON_Parse(line);
        if (row && !strcmp(cJSON_GetObjectItem(row, "name")->valuestring, "tools declared")) want = strdup(cJSON_GetObjectItem(row, "text")->valuestring);
        cJSON_Delete(row);
    }
    free(text);
    CHECK(want != NULL, "template_cases.jsonl has no case \"tools declared\"");
    char *decl[2] = {NULL, NULL}, *got = NULL;
    size_t len;
    int rc = g4_tool_declaration(weather, strlen(weather), &decl[0]) || g4_tool_declaration(sum, strlen(sum), &decl[1]);
    g4_chat_options o = g4_chat_default_options();
    o.tools = (const char *const *)decl;
    o.n_tools = 2;
    g4_chat_message m = {G4_CHAT_USER, "Weather in Paris?"};
    rc = rc || g4_chat_render(&m, 1, &o, &got, &len);
    CHECK(rc == 0 && want && !strcmp(got, want), "the prompt with converted declarations:\n   got  %s\n   want %s", got ? got : g4_last_error(),
          want ? want : "-");
    free(decl[0]), free(decl[1]), free(got), free(want);
}


/* ---- the tool-call grammar (g4_tool_call_gbnf): the template's own calls pass, wrong ones fail */

/* The functions of the fixture's calls (tool_cases.jsonl "call" rows) with schemas their
 * arguments keep to: every argument type the template writes, keys in dictsort order. */
static const char CALL_TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"city\":{\"type\":\"string\",\"maxLength\":40}},\"required\":[\"city\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"add\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":9}},\"required\":[\"a\",\"b\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"now\"}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"u\":{\"type\":\"number\"},\"v\":{\"type\":\"number\"},\"w\":{\"type\":\"number\"},\"x\":{\"type\":\"number\"},"
    "\"y\":{\"type\":\"number\"},\"z\":{\"type\":\"number\"}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"g\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"on\":{\"type\":\"boolean\"},\"off\":{\"type\":\"boolean\"},\"none\":{\"type\":[\"null\",\"string\"]}},\"required\":[\"on\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"book\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"trip\":{\"type\":\"object\",\"properties\":{\"to\":{\"enum\":[\"Rome\",\"Oslo\"]},\"From\":{\"type\":\"string\"},"
    "\"when\":{\"$ref\":\"#/$defs/when\"}},\"required\":[\"to\"]},"
    "\"seats\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":8},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"object\",\"properties\":"
    "{\"k\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}}}]}},"
    "\"empty\":{\"type\":\"array\",\"maxItems\":0},\"obj\":{\"type\":\"object\"}},"
    "\"$defs\":{\"when\":{\"type\":\"object\",\"properties\":{\"day\":{\"type\":\"integer\"}}}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"order\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"b\":{\"type\":\"integer\"},\"A\":{\"type\":\"integer\"},\"a_z\":{\"type\":\"integer\"},\"Zed\":{\"type\":\"integer\"},"
    "\"c\":{\"type\":\"integer\"}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"say\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"text\":{\"type\":\"string\"},\"emoji\":{\"type\":\"string\",\"maxLength\":1}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"write\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"body\":{\"type\":\"string\",\"pattern\":\"^line\"}}}}}]";

/* Whether the grammar takes text token by token (special tokens parsed, as the model writes them),
 * each token also in the state's mask, and ends complete there. */
static int grammar_takes(const g4_tokenizer *tok, const g4_grammar_vocab *v, const g4_grammar *g, const char *text, int parse_special) {
    int32_t *ids = NULL;
    size_t n = 0;
    if (g4_tokenizer_encode(tok, text, strlen(text), parse_special, &ids, &n)) return 0;
    g4_grammar_state *st = g4_grammar_start(g);
    size_t V = g4_grammar_vocab_size(v);
    uint32_t *mask = calloc((V + 31) / 32, sizeof *mask);
    int ok = st && mask;
    for (size_t i = 0; i < n && ok; i++) {
        ok = g4_grammar_mask(v, st, NULL, 0, mask) > 0 && ((mask[ids[i] >> 5] >> (ids[i] & 31)) & 1);
        ok = ok && g4_grammar_accept_token(v, st, ids[i]) == 0;
    }
    ok = ok && g4_grammar_is_complete(st);
    free(mask);
    free(ids);
    g4_grammar_state_free(st);
    return ok;
}

static g4_grammar *call_grammar(const g4_tokenizer *tok, const char *tools, const char *name) {
    int bad;
    char *gbnf = g4_tool_call_gbnf(tok, tools, strlen(tools), name, &bad);
    CHECK(gbnf != NULL, "g4_tool_call_gbnf(%s): %s", name ? name : "any", g4_last_error());
    g4_grammar *g = gbnf ? g4_grammar_compile(gbnf, strlen(gbnf)) : NULL;
    CHECK(!gbnf || g, "the tool call grammar does not compile: %s", g4_last_error());
    free(gbnf);
    return g;
}

static void check_call_grammar_with(const char *tokenizer_path) {
    g4_tokenizer *tok = g4_tokenizer_load(tokenizer_path);
    CHECK(tok != NULL, "%s: %s", tokenizer_path, g4_last_error());
    g4_grammar_vocab *v = tok ? g4_grammar_vocab_new(tok) : NULL;
    g4_grammar *any = v ? call_grammar(tok, CALL_TOOLS, NULL) : NULL;
    char *text;
    if (!any || g4_read_file(CASES, &text, NULL)) {
        g4_grammar_free(any), g4_grammar_vocab_free(v), g4_tokenizer_free(tok);
        return;
    }
    static const char open[] = "<|tool_call>call:";
    int n_calls = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *row = cJSON_Parse(line);
        if (row && !strcmp(cJSON_GetObjectItem(row, "kind")->valuestring, "call")) {
            const char *call = cJSON_GetObjectItem(row, "text")->valuestring, *fn = cJSON_GetObjectItem(row, "function")->valuestring;
            /* tool_choice "required": the prompt ends with "<|tool_call>call:" */
            CHECK(!strncmp(call, open, strlen(open)) && grammar_takes(tok, v, any, call + strlen(open), 1),
                  "%s: the template's call %s is refused by the grammar of any function", tokenizer_path, call);
            /* a named function: the prompt ends with "<|tool_call>call:NAME" */
            g4_grammar *named = call_grammar(tok, CALL_TOOLS, fn);
            CHECK(named && grammar_takes(tok, v, named, call + strlen(open) + strlen(fn), 1),
                  "%s: the template's call %s is refused by the grammar of %s", tokenizer_path, call, fn);
            g4_grammar_free(named);
            n_calls++;
        }
        cJSON_Delete(row);
    }
    free(text);
    CHECK(n_calls >= 8, "%d template calls checked", n_calls);
    static const struct {
        const char *text, *why;
    } wrong[] = {
        {"get_weather{city:\"Paris\"}<tool_call|>", "a JSON string, not <|\"|>"},
        {"get_weather{}<tool_call|>", "a required argument left out"},
        {"get_weather{city:<|\"|>Par<is<|\"|>}<tool_call|>", "'<' inside a string"},
        {"get_weather{city:<|\"|>Paris<|\"|>}", "no <tool_call|>"},
        {"get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>x", "text after the call"},
        {"get_weather{city:<|\"|>aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa<|\"|>}<tool_call|>", "41 characters, maxLength 40"},
        {"add{a:2.5,b:5}<tool_call|>", "a float for an integer"},
        {"add{a:2,b:10}<tool_call|>", "b above its maximum"},
        {"add{b:5,a:2}<tool_call|>", "keys out of the template's order"},
        {"add{a:2,b:5,c:1}<tool_call|>", "an undeclared argument"},
        {"add{a: 2,b:5}<tool_call|>", "whitespace the template never writes"},
        {"add{a:<|\"|>2<|\"|>,b:5}<tool_call|>", "a string for an integer"},
        {"g{on:1}<tool_call|>", "a number for a boolean"},
        {"f{u:1e400}<tool_call|>", "an exponent past a double's range (the reader takes it for a string)"},
        {"book{trip:{to:<|\"|>Paris<|\"|>}}<tool_call|>", "a value outside the enum"},
        {"book{empty:[1]}<tool_call|>", "an item past maxItems 0"},
        {"write{body:<|\"|>no line<|\"|>}<tool_call|>", "a string the pattern refuses"},
        {"unknown{}<tool_call|>", "an undeclared function"},
    };
    for (size_t i = 0; i < sizeof wrong / sizeof *wrong; i++)
        CHECK(!grammar_takes(tok, v, any, wrong[i].text, 1), "%s: the grammar took %s (%s)", tokenizer_path, wrong[i].text, wrong[i].why);
    /* <[ID]> is that token alone: the only token a mask allows, and no byte-fallback spelling of its mark (0xFF first) */
    int32_t quote = g4_tokenizer_piece_to_id(tok, "<|\"|>"), ff = g4_tokenizer_piece_to_id(tok, "<0xFF>");
    char one[64];
    snprintf(one, sizeof one, "root ::= <[%d]>", (int)quote);
    g4_grammar *g1 = g4_grammar_compile(one, strlen(one));
    g4_grammar_state *s1 = g1 ? g4_grammar_start(g1) : NULL;
    size_t V = g4_grammar_vocab_size(v);
    uint32_t *mask = calloc((V + 31) / 32, sizeof *mask);
    CHECK(s1 && mask && g4_grammar_mask(v, s1, NULL, 0, mask) == 1 && ((mask[quote >> 5] >> (quote & 31)) & 1),
          "%s: %s allows more than the one token %d", tokenizer_path, one, (int)quote);
    CHECK(ff >= 0 && s1 && g4_grammar_accept_token(v, s1, ff) != 0, "%s: <0xFF> (id %d) begins the mark of %s", tokenizer_path, (int)ff, one);
    free(mask);
    g4_grammar_state_free(s1);
    g4_grammar_free(g1);
    /* the delimiter written as text (its characters' tokens, not the special token) is not it */
    CHECK(!grammar_takes(tok, v, any, "get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>", 0),
          "%s: <|\"|> spelled by text tokens passed for the token", tokenizer_path);
    g4_grammar_free(any);
    g4_grammar_vocab_free(v);
    g4_tokenizer_free(tok);
    printf("ok tool call grammar (%s): %d template calls taken (any function and named), %zu wrong ones refused\n", tokenizer_path, n_calls,
           sizeof wrong / sizeof *wrong + 1);
}

/* tool_choice auto with a strict function (g4_tool_reply_gbnf): text, then calls; the strict
 * function's arguments by its schema, the other's any arguments; no undeclared function. */
static void check_reply_grammar(const char *tokenizer_path) {
    static const char tools[] =
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"strict\":true,\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":40}},\"required\":[\"city\"],\"additionalProperties\":false}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"add\",\"parameters\":{\"type\":\"object\",\"properties\":"
        "{\"a\":{\"type\":\"integer\"}}}}}]";
    g4_tokenizer *tok = g4_tokenizer_load(tokenizer_path);
    g4_grammar_vocab *v = tok ? g4_grammar_vocab_new(tok) : NULL;
    int bad;
    char *gbnf = v ? g4_tool_reply_gbnf(tok, tools, strlen(tools), &bad) : NULL;
    g4_grammar *g = gbnf ? g4_grammar_compile(gbnf, strlen(gbnf)) : NULL;
    CHECK(g != NULL, "%s: the reply grammar of a strict tool: %s", tokenizer_path, g4_last_error());
    static const char *const take[] = {
        "It is sunny.",
        "3 < 5, 2 <<= 4 <",
        "Let me check. <|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>",
        "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|><|tool_call>call:get_weather{city:<|\"|>Rome<|\"|>}<tool_call|>",
        "<|tool_call>call:add{a:2}<tool_call|>",
        "<|tool_call>call:add{x:<|\"|>any<|\"|>,y:[1,2]}<tool_call|>",
    };
    static const char *const refuse[] = {
        "<|tool_call>call:get_weather{city:\"Paris\"}<tool_call|>",
        "<|tool_call>call:get_weather{}<tool_call|>",
        "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:3}<tool_call|>",
        "<|tool_call>call:other{}<tool_call|>",
        "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|> and then text",
        "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}",
    };
    for (size_t i = 0; g && i < sizeof take / sizeof *take; i++)
        CHECK(grammar_takes(tok, v, g, take[i], 1), "%s: the reply grammar refused %s", tokenizer_path, take[i]);
    for (size_t i = 0; g && i < sizeof refuse / sizeof *refuse; i++)
        CHECK(!grammar_takes(tok, v, g, refuse[i], 1), "%s: the reply grammar took %s", tokenizer_path, refuse[i]);
    /* a call written in text (its markers' characters, not the tokens) would pass the reader unconstrained */
    CHECK(g && !grammar_takes(tok, v, g, "Sure. <|tool_call>call:get_weather{}<tool_call|>", 0), "%s: the reply grammar took a call spelled in text",
          tokenizer_path);
    /* no strict function: nothing to enforce, said so */
    static const char loose[] = "[{\"type\":\"function\",\"function\":{\"name\":\"add\"}}]";
    char *none = tok ? g4_tool_reply_gbnf(tok, loose, strlen(loose), &bad) : NULL;
    CHECK(!none && strstr(g4_last_error(), "no strict tools"), "a reply grammar without strict tools: %s", none ? none : g4_last_error());
    free(none);
    free(gbnf);
    g4_grammar_free(g);
    g4_grammar_vocab_free(v);
    g4_tokenizer_free(tok);
    printf("ok reply grammar (%s): %zu replies taken, %zu refused\n", tokenizer_path, sizeof take / sizeof *take, sizeof refuse / sizeof *refuse + 1);
}

/* What the grammar cannot enforce is refused, naming the tool. */
static void check_call_grammar_refusals(const char *tokenizer_path) {
    g4_tokenizer *tok = g4_tokenizer_load(tokenizer_path);
    if (!tok) return;
    static const struct {
        const char *tools, *want;
        int bad;
    } cases[] = {
        {"[{\"type\":\"function\",\"function\":{\"name\":\"a\"}},{\"type\":\"function\",\"function\":{\"name\":\"b\",\"parameters\":"
         "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\",\"multipleOf\":2}}}}}]", "multipleOf", 1},
        {"[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"parameters\":{\"type\":\"string\"}}}]", "type", 0},
        {"[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"parameters\":{\"type\":\"object\",\"properties\":{\"x y\":{}}}}}]",
         "bare", 0},
        {"[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"parameters\":{\"type\":\"object\",\"properties\":{\"x\":{\"const\":\"<b>\"}}}}}]",
         "const", 0},
        {"[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"parameters\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"string\","
         "\"pattern\":\"<[a-z]+>\"}}}}}]", "'<'", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int bad = 7;
        char *g = g4_tool_call_gbnf(tok, cases[i].tools, strlen(cases[i].tools), NULL, &bad);
        CHECK(!g && bad == cases[i].bad && strstr(g4_last_error(), cases[i].want) && one_line(g4_last_error()),
              "tools %zu: %s (tool %d): want a refusal naming %s at tool %d", i, g ? "compiled" : g4_last_error(), bad, cases[i].want, cases[i].bad);
        free(g);
    }
    int bad;
    char *g = g4_tool_call_gbnf(tok, CALL_TOOLS, strlen(CALL_TOOLS), "nope", &bad);
    CHECK(!g && strstr(g4_last_error(), "no tool has that name"), "a name no tool has: %s", g ? "compiled" : g4_last_error());
    free(g);
    g4_tokenizer_free(tok);
    printf("ok tool call grammar refusals\n");
}

int main(void) {
    char real[1024];
    snprintf(real, sizeof real, "%s/data/tokenizers/gemma4/tokenizer.json", check_shared_dir());
    check_call_grammar_with("models/gemma4-tiny-math/tokenizer.json"); /* the built-in model's, 757 tokens */
    check_call_grammar_with(real);                                     /* Gemma 4's, 262,144 tokens */
    check_call_grammar_refusals("models/gemma4-tiny-math/tokenizer.json");
    check_reply_grammar("models/gemma4-tiny-math/tokenizer.json");
    check_reply_grammar(real);
    check_fixture();
    check_parser();
    check_rendered_prompt();
    return check_report("test_tools");
}

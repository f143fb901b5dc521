/* JSON-Schema-Test-Suite cases where the grammar knowingly differs from draft 2020-12, included
 * by tests/test_grammar.c: {file, schema description, test description, reason}. */
/* The grammar fixes the order of an object's keys to the order of "properties" (a grammar cannot
 * take any order of n optional keys without n! rules; llama.cpp and xgrammar do the same). */
{"allOf.json", "allOf", "allOf", "key order: properties in schema order"},
{"allOf.json", "allOf with base schema", "valid", "key order: properties in schema order"},
{"const.json", "const with object", "same object with different property order is valid", "key order: a const object in its own order"},
/* format is only an annotation in 2020-12 by default; the grammar asserts it, as structured
 * output needs (OpenAI's strict mode and llama.cpp do the same). */
{"format.json", "email format", "invalid email string is only an annotation by default", "format asserted"},
{"format.json", "date format", "invalid date string is only an annotation by default", "format asserted"},
{"format.json", "time format", "invalid time string is only an annotation by default", "format asserted"},
{"format.json", "uuid format", "invalid uuid string is only an annotation by default", "format asserted"},

#!/usr/bin/env python3
"""Validates generated outputs against their JSON schemas with Python's jsonschema (an
independent validator: nothing of g4's grammar code). Input: lines of {"schema": ..., "text": ...}
(text: what g4 generated). Prints one line per failure and a summary; exit 1 when any output does
not parse as JSON or does not validate (format checked: date, time, date-time, uuid, email)."""
import json
import sys

try:
    import jsonschema
except ImportError:
    sys.exit("validate.py: Python's jsonschema is missing (apt-get install python3-jsonschema)")


def main(path):
    bad = n = 0
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    with open(path, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            n += 1
            try:
                value = json.loads(rec["text"])
                jsonschema.Draft202012Validator(rec["schema"], format_checker=checker).validate(value)
            except (ValueError, jsonschema.ValidationError) as e:
                bad += 1
                print(f"invalid: {rec['text']!r}: {str(e).splitlines()[0]}")
    print(f"validate.py: {n - bad} of {n} outputs valid")
    return 1 if bad or n == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

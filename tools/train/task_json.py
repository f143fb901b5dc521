#!/usr/bin/env python3
r"""The JSON task of train_tiny_qat.py (--task json): follow a JSON schema given as text.

Each example is a random schema written the way Pydantic's `model_json_schema()` writes it (title,
type object, properties with title/type, enum (Literal), integer minimum/maximum, string maxLength,
boolean, number, arrays of strings (maxItems), optional fields with a default (anyOf null), extra
="forbid" as additionalProperties false, one nested model through $defs/$ref), 1-6 fields named from a
broad word pool, rendered into a chat prompt in one of the forms clients use:

  instructor   instructor Mode.JSON's system message (its text, json.dumps(schema, indent=2)) + a user turn
  format       LangChain PydanticOutputParser.get_format_instructions() after the user's request
  plain        "Answer in JSON matching this schema: {...}" before the request (user or system turn)
  keys         LangChain json_mode's documented "Make sure to return a JSON blob with keys 'a' and 'b'."
               (no constraint is visible, so its schemas carry none: types from the field words only)

The user turn either gives the values in prose ("Here is a pet: kind is dog, legs is 4, ...") or asks
for an example ("Describe a pet as JSON."). The reply is one JSON instance with every property in the
schema's order, values from the prose when given, else drawn within every constraint, written as
json.dumps writes it ('{"a": 1, "b": "x"}', which g4's JSON grammars allow), then <turn|>.

Pure Python (no torch): `python3 tools/train/task_json.py sample N` prints N examples. validate() is a
small JSON-schema validator for exactly the keywords generated here (the training host has no
jsonschema); tests/structured/validate.py (Python's jsonschema) is the independent check in the tests.
"""

import json
import random
import sys
from collections import OrderedDict
from textwrap import dedent

# ----------------------------------------------------------------------------------------------
# word pools: every field word has one type (so the keys form can be answered) and a value pool
# ----------------------------------------------------------------------------------------------

TITLES = ["Pet", "Book", "Movie", "Person", "City", "Car", "Recipe", "Product", "Order", "Event", "Song", "Animal",
          "Plant", "House", "Employee", "Student", "Course", "Team", "Game", "Hotel", "Flight", "Restaurant", "Device",
          "Planet", "Tree", "Bird", "Fruit", "Shirt", "Shoe", "Ticket", "Task", "Project", "Account", "Review",
          "Invoice", "Message", "Camera", "Phone", "Laptop", "Bike", "Boat", "Garden", "Farm", "School", "Museum",
          "Park", "Robot", "Toy", "Drink", "Cake", "Painting", "Album", "Player", "Club", "Store", "Room", "Trip",
          "Meeting", "Horse", "Fish", "Dog", "Cat", "Vehicle", "Item", "Customer", "User", "Profile", "Address",
          "Weather", "Sensor", "Package", "Lesson", "Artist", "Band", "Podcast", "Dish", "Toolkit", "Owner",
          "UserProfile", "WeatherReport", "BookReview", "PetOwner", "ShoppingItem", "TrainTicket", "GameScore",
          "MovieNight", "CarRental", "HouseListing", "JobPosting", "SportsTeam"]

NAMES = ["Rex", "Bella", "Max", "Luna", "Milo", "Coco", "Daisy", "Oscar", "Nala", "Leo", "Mia", "Sam", "Ava",
         "Noah", "Emma", "Liam", "Zoe", "Omar", "Lucy", "Ben", "Nina", "Ivy", "Tom", "Aria", "Eli", "Maya", "Jack",
         "Lily", "Ravi", "Sara", "Owen", "Ruby", "Finn", "Rosa", "Hugo", "Iris", "Kai", "Lola", "Otto", "Pip",
         "Teddy", "Ziggy", "Buddy", "Shadow", "Pepper", "Biscuit", "Whiskers", "Clementine", "Alexander",
         "Charlotte", "Benjamin", "Penelope", "Sebastian", "Gabriella"]
WORDS = ["red", "blue", "green", "apple", "river", "stone", "cloud", "maple", "north", "delta", "orbit", "pixel",
         "ocean", "forest", "silver", "golden", "summer", "winter", "spring", "autumn", "rocket", "garden", "castle",
         "harbor", "meadow", "canyon", "thunder", "crystal", "velvet", "copper", "falcon", "tiger", "panda", "lemon",
         "mango", "olive", "cedar", "willow", "breeze", "ember", "frost", "sunset", "horizon", "lantern", "compass",
         "journey", "festival", "mountain", "island", "village", "kitchen", "library", "market", "station",
         "blueberry", "adventure", "symphony", "chocolate", "butterfly", "waterfall", "strawberry", "everything"]
COLORS = ["red", "blue", "green", "black", "white", "gray", "yellow", "orange", "purple", "pink", "brown", "teal",
          "silver", "gold", "navy", "beige", "crimson", "turquoise"]
CITIES = ["Paris", "Rome", "Oslo", "Lima", "Cairo", "Tokyo", "Berlin", "Madrid", "Dublin", "Vienna", "Lisbon",
          "Prague", "Boston", "Denver", "Austin", "Seattle", "Toronto", "Sydney", "Nairobi", "Mumbai", "Santiago",
          "Barcelona", "Amsterdam", "Stockholm", "Melbourne", "Vancouver", "Copenhagen", "Edinburgh"]
COUNTRIES = ["Peru", "Chad", "Fiji", "Iran", "Oman", "Italy", "Spain", "Japan", "Kenya", "Chile", "France", "Norway",
             "Canada", "Brazil", "Mexico", "Sweden", "Germany", "Ireland", "Portugal", "Australia", "Argentina"]
BRANDS = ["Acme", "Zeta", "Nova", "Apex", "Orion", "Vega", "Lumen", "Atlas", "Pulse", "Kite", "Summit", "Harbor",
          "Quantum", "Evergreen", "Starlight", "Northwind"]
GENRES = ["jazz", "rock", "pop", "drama", "comedy", "horror", "fantasy", "mystery", "romance", "thriller",
          "poetry", "history", "science", "folk", "blues", "classical", "adventure", "documentary"]
LANGS = ["English", "French", "Spanish", "German", "Italian", "Hindi", "Arabic", "Korean", "Swahili", "Dutch",
         "Greek", "Polish", "Turkish", "Japanese", "Portuguese"]
ANIMALS = ["cat", "dog", "fish", "bird", "horse", "rabbit", "snake", "hamster", "turtle", "parrot", "lizard",
           "frog", "mouse", "goat", "sheep", "cow", "duck", "ferret", "pony", "spider"]
FOODS = ["cheese", "tomato", "onion", "basil", "garlic", "rice", "egg", "flour", "sugar", "butter", "salt",
         "pepper", "olive", "ham", "bacon", "mushroom", "spinach", "lemon", "honey", "milk", "corn", "beans"]
SKILLS = ["python", "cooking", "drawing", "writing", "singing", "chess", "swimming", "design", "math", "driving",
          "sales", "sql", "guitar", "piano", "running", "coding", "teaching", "painting"]

# enum fields: the values an enum of that word draws from (a Literal of 2-5 of them)
ENUMS = {
    "kind": ANIMALS, "species": ANIMALS, "status": ["open", "closed", "pending", "done", "active", "draft", "paid",
                                                    "shipped", "cancelled", "archived"],
    "size": ["S", "M", "L", "XL", "small", "medium", "large", "tiny", "huge"],
    "category": ["food", "books", "toys", "tools", "music", "sports", "garden", "office", "travel", "health"],
    "mood": ["happy", "sad", "calm", "angry", "tired", "excited", "bored", "curious"],
    "priority": ["low", "medium", "high", "urgent"], "season": ["spring", "summer", "autumn", "winter"],
    "shape": ["circle", "square", "triangle", "oval", "star", "hexagon"],
    "day": ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"],
    "unit": ["kg", "g", "lb", "m", "cm", "km", "mile", "liter"], "grade": ["A", "B", "C", "D", "E", "F"],
    "genre": GENRES, "weather": ["sunny", "rainy", "cloudy", "windy", "snowy", "foggy", "stormy"],
    "role": ["admin", "user", "guest", "editor", "owner", "viewer"], "level": ["easy", "normal", "hard", "expert"],
    "type": ["basic", "premium", "standard", "pro", "free", "trial"], "currency": ["USD", "EUR", "GBP", "JPY", "INR"],
    "fuel": ["petrol", "diesel", "electric", "hybrid"], "diet": ["vegan", "vegetarian", "omnivore", "keto"],
    "color": COLORS, "position": ["goalkeeper", "defender", "midfielder", "forward"],
    "direction": ["north", "south", "east", "west"], "material": ["wood", "metal", "glass", "plastic", "cotton",
                                                                  "wool", "leather", "paper"],
}
# integer fields: their natural range (values of the keys form and the widest bounds a schema gives)
INTS = {
    "legs": (0, 8), "age": (0, 99), "year": (1900, 2025), "pages": (10, 1200), "count": (0, 100),
    "rating": (1, 5), "score": (0, 100), "weight": (1, 500), "floors": (1, 60), "rooms": (1, 12), "seats": (1, 9),
    "wheels": (2, 18), "doors": (2, 5), "quantity": (1, 50), "stock": (0, 999), "rank": (1, 100), "days": (1, 31),
    "hours": (0, 23), "minutes": (0, 59), "population": (100, 99999), "capacity": (1, 500), "speed": (0, 300),
    "players": (1, 22), "episodes": (1, 99), "tracks": (1, 30), "chapters": (1, 60), "guests": (1, 200),
    "lives": (0, 9), "month": (1, 12), "duration": (1, 240), "page_count": (10, 1200), "max_speed": (10, 320),
    "num_rooms": (1, 12), "item_count": (0, 100), "build_year": (1900, 2025), "stars": (1, 5), "calories": (0, 2000),
    "likes": (0, 9999), "port": (1, 65535), "points": (0, 999), "goals": (0, 20), "height_cm": (30, 230),
}
STRS = {
    "name": NAMES, "nickname": NAMES, "first_name": NAMES, "owner": NAMES, "author": NAMES, "artist": NAMES,
    "director": NAMES, "coach": NAMES, "captain": NAMES, "pilot": NAMES, "title": WORDS, "label": WORDS,
    "code": WORDS, "model": BRANDS, "brand": BRANDS, "company": BRANDS, "maker": BRANDS, "city": CITIES,
    "town": CITIES, "origin": CITIES, "destination": CITIES, "country": COUNTRIES, "nationality": COUNTRIES,
    "language": LANGS, "breed": ["poodle", "beagle", "boxer", "pug", "husky", "collie", "corgi", "siamese",
                                 "persian", "sphynx", "bulldog", "terrier"],
    "street": ["Main St", "Oak Ave", "Elm St", "High St", "Park Rd", "Lake Dr", "Hill Rd", "Pine St"],
    "note": WORDS, "team": BRANDS, "favorite_food": FOODS, "topic": SKILLS, "hobby": SKILLS, "subject": SKILLS,
    "band": BRANDS, "venue": CITIES, "planet": ["Mars", "Venus", "Earth", "Jupiter", "Saturn", "Mercury", "Neptune"],
}
BOOLS = ["indoor", "active", "available", "verified", "vegan", "organic", "sold", "open", "public", "electric",
         "wild", "married", "paid", "done", "shipped", "featured", "spicy", "trained", "vaccinated", "online",
         "enabled", "premium", "completed", "in_stock", "is_open", "has_garden", "is_active", "waterproof", "remote"]
NUMS = {"price": (0.5, 999.0), "height": (0.1, 50.0), "distance": (0.1, 999.0), "temperature": (-30.0, 45.0),
        "latitude": (-90.0, 90.0), "longitude": (-180.0, 180.0), "amount": (1.0, 9999.0), "balance": (0.0, 9999.0),
        "length": (0.1, 99.0), "width": (0.1, 99.0), "volume": (0.1, 99.0), "discount": (0.0, 0.9),
        "ratio": (0.0, 1.0), "cost": (1.0, 999.0), "mass": (0.1, 500.0), "area": (1.0, 999.0)}
ARRAYS = {"tags": WORDS, "colors": COLORS, "toppings": FOODS, "skills": SKILLS, "authors": NAMES, "genres": GENRES,
          "ingredients": FOODS, "languages": LANGS, "friends": NAMES, "keywords": WORDS, "members": NAMES,
          "hobbies": SKILLS, "cities": CITIES, "features": WORDS, "pets": ANIMALS}

FIELD_KINDS = ([("enum", w) for w in ENUMS] + [("int", w) for w in INTS] + [("str", w) for w in STRS]
               + [("bool", w) for w in BOOLS] + [("num", w) for w in NUMS] + [("array", w) for w in ARRAYS])
# a nested model's field names (its title comes from TITLES)
NESTED_FIELDS = ["address", "location", "owner_info", "details", "stats", "specs", "contact", "origin_info",
                 "dimensions", "settings", "info", "meta"]


def field_title(word):
    """Pydantic's default title of a field: words split at '_', each capitalized."""
    return " ".join(w.capitalize() for w in word.split("_"))


def title_words(title):
    """'WeatherReport' -> 'weather report' (for the request text)."""
    out = ""
    for ch in title:
        out += (" " + ch.lower()) if ch.isupper() and out else ch.lower()
    return out


def article(words):
    return "an" if words[0] in "aeiou" else "a"


# ----------------------------------------------------------------------------------------------
# schemas as Pydantic writes them (keys of every schema object sorted; properties in field order)
# ----------------------------------------------------------------------------------------------


def _field_spec(rng, kind, word, loose):
    """One field: (spec dict: kind, word, constraints, optional/default) used for both schema and values."""
    sp = {"kind": kind, "word": word}
    if kind == "enum":
        pool = ENUMS[word]
        if loose:
            sp["kind"] = "str"  # no Literal visible in the keys form: a plain string of the word's pool
            sp["pool"] = pool
        else:
            sp["enum"] = rng.sample(pool, rng.randint(2, min(5, len(pool))))
    elif kind == "int":
        lo, hi = INTS[word]
        if not loose and rng.random() < 0.75:
            a, b = sorted(rng.sample(range(lo, hi + 1), 2)) if hi - lo < 60 else (lo, rng.randint(lo + 1, hi))
            if rng.random() < 0.4:
                a = lo
            sp["min"], sp["max"] = a, b
            if rng.random() < 0.15:
                del sp["min" if rng.random() < 0.5 else "max"]
        sp["range"] = (sp.get("min", lo), sp.get("max", hi))
    elif kind == "str":
        sp["pool"] = STRS[word]
        if not loose and rng.random() < 0.5:
            shortest = min(len(x) for x in sp["pool"])
            sp["maxLength"] = rng.choice([max(shortest, 4), 6, 8, 8, 10, 12, 16, 20, 32, 50])
            sp["maxLength"] = max(sp["maxLength"], shortest)
    elif kind == "num":
        sp["range"] = NUMS[word]
    elif kind == "array":
        sp["pool"] = ARRAYS[word]
        if not loose and rng.random() < 0.3:
            sp["maxItems"] = rng.randint(1, 4)
    if rng.random() < 0.2 and kind != "nested":
        sp["optional"] = True  # `x: T | None = None`, or a plain default
        sp["default"] = None if rng.random() < 0.6 else _value(rng, sp)
    return sp


def _type_schema(sp):
    """The schema of a field's value type (no title/default)."""
    k = sp["kind"]
    if k == "enum":
        return {"enum": list(sp["enum"]), "type": "string"}
    if k == "int":
        s = {"type": "integer"}
        if "min" in sp:
            s["minimum"] = sp["min"]
        if "max" in sp:
            s["maximum"] = sp["max"]
        return s
    if k == "str":
        s = {"type": "string"}
        if "maxLength" in sp:
            s["maxLength"] = sp["maxLength"]
        return s
    if k == "bool":
        return {"type": "boolean"}
    if k == "num":
        return {"type": "number"}
    if k == "array":
        s = {"items": {"type": "string"}, "type": "array"}
        if "maxItems" in sp:
            s["maxItems"] = sp["maxItems"]
        return s
    if k == "nested":
        return {"$ref": "#/$defs/" + sp["model"]["title"]}
    raise ValueError(k)


def _prop_schema(sp):
    t = OrderedDict(sorted(_type_schema(sp).items()))
    if sp.get("optional") and sp["default"] is None:
        if "$ref" in t:
            s = {"anyOf": [t, {"type": "null"}]}
        else:
            s = {"anyOf": [t, {"type": "null"}]}
        s["default"] = None
    else:
        s = dict(t)
        if sp.get("optional"):
            s["default"] = sp["default"]
    if "$ref" not in s:
        s["title"] = field_title(sp["word"])
    return OrderedDict(sorted(s.items()))


def model_schema(model, defs=None):
    """Pydantic's model_json_schema() for a model {title, fields, forbid}: sorted keys, properties in order."""
    s = {"properties": OrderedDict((sp["word"], _prop_schema(sp)) for sp in model["fields"]),
         "title": model["title"], "type": "object"}
    req = [sp["word"] for sp in model["fields"] if not sp.get("optional")]
    if req:
        s["required"] = req
    if model.get("forbid"):
        s["additionalProperties"] = False
    if defs:
        s["$defs"] = OrderedDict(sorted((d["title"], model_schema(d)) for d in defs))
    return OrderedDict(sorted(s.items()))


def make_model(rng, loose=False, nested_ok=True, n_fields=None):
    title = rng.choice(TITLES)
    n = n_fields or rng.choices([1, 2, 3, 4, 5, 6], weights=[1, 2, 3, 4, 3, 2])[0]
    picks = rng.sample(FIELD_KINDS, n)
    fields = [_field_spec(rng, k, w, loose) for k, w in picks]
    defs = []
    if nested_ok and not loose and n >= 2 and rng.random() < 0.12:
        sub = make_model(rng, nested_ok=False, n_fields=rng.randint(1, 3))
        while sub["title"] == title:
            sub["title"] = rng.choice(TITLES)
        word = rng.choice([w for w in NESTED_FIELDS if w not in {f["word"] for f in fields}])
        fields.insert(rng.randrange(len(fields) + 1), {"kind": "nested", "word": word, "model": sub})
        defs.append(sub)
    return {"title": title, "fields": fields, "forbid": (not loose) and rng.random() < 0.35, "defs": defs}


# ----------------------------------------------------------------------------------------------
# values
# ----------------------------------------------------------------------------------------------


def _value(rng, sp):
    k = sp["kind"]
    if k == "enum":
        return rng.choice(sp["enum"])
    if k == "int":
        lo, hi = sp["range"]
        return rng.randint(lo, hi)
    if k == "str":
        ml = sp.get("maxLength", 10 ** 9)
        return rng.choice([x for x in sp["pool"] if len(x) <= ml])
    if k == "bool":
        return rng.random() < 0.5
    if k == "num":
        lo, hi = sp["range"]
        v = round(rng.uniform(lo, hi), rng.choice([1, 1, 2]))
        return v if v != int(v) else v + 0.5 if v + 0.5 <= hi else v - 0.5
    if k == "array":
        n = rng.randint(1, min(3, sp.get("maxItems", 3)))
        return rng.sample(sp["pool"], n)
    if k == "nested":
        return instance(rng, sp["model"])
    raise ValueError(k)


def instance(rng, model):
    """Every property in order (as model_dump writes them): an optional field keeps its default half the time."""
    out = OrderedDict()
    for sp in model["fields"]:
        if sp.get("optional") and rng.random() < 0.5:
            out[sp["word"]] = sp["default"]
        else:
            out[sp["word"]] = _value(rng, sp)
    return out


def dumps(v):
    """The reply's JSON: json.dumps' default separators ('{"a": 1, "b": "x"}')."""
    return json.dumps(v, ensure_ascii=False)


# ----------------------------------------------------------------------------------------------
# prompts
# ----------------------------------------------------------------------------------------------


def instructor_system(schema):
    """instructor 1.17 Mode.JSON's system message (instructor/v2/providers/openai/handlers.py, OpenAIJSONHandler)."""
    return dedent(
        f"""
            As a genius expert, your task is to understand the content and provide
            the parsed objects in json that match the following json_schema:\n

            {json.dumps(schema, indent=2, ensure_ascii=False)}

            Make sure to return an instance of the JSON, not the schema itself
            """
    )


FORMAT_INSTRUCTIONS = """The output should be formatted as a JSON instance that conforms to the JSON schema below.

As an example, for the schema {{"properties": {{"foo": {{"title": "Foo", "description": "a list of strings", "type": "array", "items": {{"type": "string"}}}}}}, "required": ["foo"]}}
the object {{"foo": ["bar", "baz"]}} is a well-formatted instance of the schema. The object {{"properties": {{"foo": ["bar", "baz"]}}}} is not well-formatted.

Here is the output schema:
```
{schema}
```"""


def format_instructions(schema):
    """LangChain 1.x PydanticOutputParser.get_format_instructions(): the schema less title and type, compact."""
    reduced = OrderedDict((k, v) for k, v in schema.items() if k not in ("title", "type"))
    return FORMAT_INSTRUCTIONS.format(schema=json.dumps(reduced, ensure_ascii=False))


def keys_phrase(keys):
    q = ["'%s'" % k for k in keys]
    return q[0] if len(q) == 1 else ", ".join(q[:-1]) + " and " + q[-1]


def _say(rng, v):
    if isinstance(v, bool):
        return rng.choice(["true", "yes"]) if v else rng.choice(["false", "no"])
    if v is None:
        return "none"
    if isinstance(v, list):
        return v[0] if len(v) == 1 else ", ".join(v[:-1]) + " and " + v[-1]
    if isinstance(v, dict):
        return "(" + ", ".join("%s %s" % (k.replace("_", " "), _say(rng, x)) for k, x in v.items()) + ")"
    return str(v)


def prose(rng, model, inst):
    """The values in a sentence: 'Here is a pet: kind is dog, legs is 4, indoor is yes and name is Rex.'"""
    tw = title_words(model["title"])
    parts = []
    items = list(inst.items())
    for k, v in items:
        word = k.replace("_", " ")
        form = rng.random()
        if form < 0.5:
            parts.append("%s is %s" % (word, _say(rng, v)))
        elif form < 0.8:
            parts.append("%s: %s" % (word, _say(rng, v)))
        else:
            parts.append("its %s is %s" % (word, _say(rng, v)))
    body = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    lead = rng.choice(["Here is %s %s: " % (article(tw), tw), "%s %s with " % (article(tw).capitalize(), tw),
                       "The %s has " % tw, "Details of the %s: " % tw, ""])
    text = lead + body + "."
    return text[0].upper() + text[1:]


def example_request(rng, model):
    tw = title_words(model["title"])
    a = article(tw)
    return rng.choice([f"Describe {a} {tw} as JSON.", f"Describe {a} {tw}.", f"Give me an example {tw}.",
                       f"Make up {a} {tw}.", f"Create {a} {tw} in JSON.", f"Return a sample {tw}.",
                       f"Generate {a} {tw}.", f"Invent {a} {tw} as JSON."])


def extract_request(rng, model, text):
    tw = title_words(model["title"])
    return rng.choice([text, text, f"Extract the {tw} from this text: {text}", f"Parse this into JSON. {text}",
                       f"{text} Return it as JSON."])


FORMS = ["instructor", "format", "plain", "plain_system", "keys"]
FORM_WEIGHTS = [5, 3, 2, 1, 1]


def make_example(rng):
    """One example: dict(form, system (or None), user, schema, reply, value)."""
    form = rng.choices(FORMS, weights=FORM_WEIGHTS)[0]
    loose = form == "keys"
    model = make_model(rng, loose=loose)
    schema = model_schema(model, model["defs"])
    inst = instance(rng, model)
    if rng.random() < 0.5:
        request = extract_request(rng, model, prose(rng, model, inst))
    else:
        request = example_request(rng, model)
    system = None
    if form == "instructor":
        system = instructor_system(schema)
        user = request
    elif form == "format":
        user = request + "\n\n" + format_instructions(schema)
    elif form == "plain":
        user = "Answer in JSON matching this schema: " + json.dumps(schema, ensure_ascii=False) + "\n\n" + request
    elif form == "plain_system":
        system = "Answer in JSON matching this schema: " + json.dumps(schema, ensure_ascii=False)
        user = request
    else:
        keys = keys_phrase([sp["word"] for sp in model["fields"]])
        user = rng.choice([f"{request} Make sure to return a JSON blob with keys {keys}.",
                           f"Make sure to return a JSON blob with keys {keys}.\n\n{request}",
                           f"Return JSON with keys {keys}. {request}"])
    return {"form": form, "system": system, "user": user, "schema": schema, "reply": dumps(inst)}


def chat_prompt(ex):
    """The Gemma 4 chat template's rendering (CHAT_TEMPLATE of train_tiny_qat.py, as g4 serve renders it):
    contents trimmed, an optional system turn, the user turn, the generation prompt."""
    s = "<bos>"
    if ex.get("system") is not None:
        s += "<|turn>system\n" + ex["system"].strip() + "<turn|>\n"
    return s + "<|turn>user\n" + ex["user"].strip() + "<turn|>\n<|turn>model\n"


def example_key(ex):
    return (ex["system"] or "") + "\x00" + ex["user"]


# ----------------------------------------------------------------------------------------------
# validation (the keywords generated above; Draft 2020-12 semantics)
# ----------------------------------------------------------------------------------------------


def _is_type(v, t):
    if t == "object":
        return isinstance(v, dict)
    if t == "array":
        return isinstance(v, list)
    if t == "string":
        return isinstance(v, str)
    if t == "integer":
        return isinstance(v, int) and not isinstance(v, bool) or isinstance(v, float) and v.is_integer()
    if t == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if t == "boolean":
        return isinstance(v, bool)
    if t == "null":
        return v is None
    raise ValueError("type " + t)


def validate(value, schema, root=None):
    """True when value is an instance of schema (the keywords this module writes; anything else is an error)."""
    root = root or schema
    known = {"title", "type", "properties", "required", "additionalProperties", "$defs", "enum", "minimum",
             "maximum", "maxLength", "items", "maxItems", "anyOf", "default", "$ref"}
    unknown = set(schema) - known
    if unknown:
        raise ValueError("validate: keyword(s) %s not handled" % sorted(unknown))
    if "$ref" in schema:
        name = schema["$ref"].split("/")[-1]
        if not validate(value, root["$defs"][name], root):
            return False
    if "anyOf" in schema and not any(validate(value, s, root) for s in schema["anyOf"]):
        return False
    if "type" in schema and not _is_type(value, schema["type"]):
        return False
    if "enum" in schema and not any(value == e and type(value) is type(e) for e in schema["enum"]):
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            return False
        if "maximum" in schema and value > schema["maximum"]:
            return False
    if isinstance(value, str) and "maxLength" in schema and len(value) > schema["maxLength"]:
        return False
    if isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            return False
        if "items" in schema and not all(validate(x, schema["items"], root) for x in value):
            return False
    if isinstance(value, dict):
        props = schema.get("properties", {})
        if any(k not in value for k in schema.get("required", [])):
            return False
        if schema.get("additionalProperties") is False and any(k not in props for k in value):
            return False
        if not all(validate(value[k], props[k], root) for k in value if k in props):
            return False
    return True


def check_reply(text, schema):
    """(parses as a JSON object, validates against schema, has the schema's keys in order)."""
    try:
        v = json.loads(text, object_pairs_hook=OrderedDict)
    except ValueError:
        return False, False, False
    if not isinstance(v, dict):
        return False, False, False
    ok = validate(v, schema)
    return True, ok, ok and list(v) == list(schema.get("properties", {}))


def gen_examples(seed, n, exclude=None):
    rng = random.Random(seed)
    out, seen = [], set(exclude or ())
    while len(out) < n:
        ex = make_example(rng)
        k = example_key(ex)
        if k in seen:
            continue
        seen.add(k)
        out.append(ex)
    return out


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "sample":
        for ex in gen_examples(int(sys.argv[3]) if len(sys.argv) > 3 else 1, int(sys.argv[2])):
            print("=" * 60, ex["form"])
            print(chat_prompt(ex) + ex["reply"] + "<turn|>")
            assert validate(json.loads(ex["reply"]), ex["schema"])
    else:
        sys.exit("usage: task_json.py sample N [SEED]")

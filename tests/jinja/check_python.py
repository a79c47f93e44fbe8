#!/usr/bin/env python3
"""check_python.py: renders the pairs of gen_expected.mjs with Python's Jinja2 configured as Hugging
Face's apply_chat_template configures it (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, HF's tojson/raise_exception/strftime_now) and reports where it disagrees with
expected/ (the @huggingface/jinja renders). A developer's cross-check of the fixtures; needs Jinja2.
With --write, a pair where @huggingface/jinja raised but Jinja2 rendered gets expected/T/C.jinja2.txt."""
import datetime, json, os, sys
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.ext import loopcontrols
from jinja2.exceptions import TemplateError

here = os.path.dirname(os.path.abspath(__file__))
cases = json.load(open(os.path.join(here, "conversations.json"), encoding="utf-8"))
tpls = json.load(open(os.path.join(here, "templates.json"), encoding="utf-8"))

def raise_exception(message):
    raise TemplateError(message)

def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

def strftime_now(fmt):
    return datetime.datetime.fromtimestamp(cases["now_unix"], datetime.timezone.utc).strftime(fmt)

env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = strftime_now
same = differ = 0
for name, meta in tpls.items():
    t = env.from_string(open(os.path.join(here, "templates", name + ".jinja"), encoding="utf-8").read())
    for conv in cases["conversations"]:
        ctx = dict(conv["context"])
        for k in ("bos_token", "eos_token"):
            if k in meta: ctx[k] = meta[k]
        base = os.path.join(here, "expected", name, conv["id"])
        try:
            got, err = t.render(**ctx), None
        except Exception as e:
            got, err = None, e
        have = [e for e in (".jinja2.txt", ".txt") if os.path.exists(base + e)]
        if have:
            want = open(base + have[0], encoding="utf-8", newline="").read()
            ok = got == want
        else:
            ok = got is None
        if ok: same += 1
        elif "--write" in sys.argv and got is not None:
            # the two references disagree: keep Jinja2's text (what transformers renders) beside
            # the other's error; test_jinja then expects the Jinja2 text
            open(base + ".jinja2.txt", "w", encoding="utf-8", newline="").write(got)
            print(f"WROTE {name}/{conv['id']}.jinja2.txt")
            same += 1
        else:
            differ += 1
            print(f"DIFFER {name}/{conv['id']}: python {'error ' + repr(str(err)) if got is None else repr(got[:300])}")
# snippets.txt: small templates pinning Python/Jinja2 semantics (scoping, number and container
# printing, Unicode case, tuples, whitespace); Jinja2 is their reference, written with --write
SNIP_CTX = {"m": [{"role": "user", "content": "a"},
                  {"role": "assistant", "content": "b", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]}],
            "d": {"b": 1, "a": [1, 2.5, None]}, "s": "  H\u00e9 llo\n", "n": None, "f": 2.0, "i": 7}
snips = [x for x in open(os.path.join(here, "snippets.txt"), encoding="utf-8").read().split("\n=====\n") if x.strip()]
os.makedirs(os.path.join(here, "expected", "snippets"), exist_ok=True)
json.dump(SNIP_CTX, open(os.path.join(here, "snippets_context.json"), "w", encoding="utf-8"), ensure_ascii=False)
for k, sn in enumerate(snips):
    base = os.path.join(here, "expected", "snippets", "%02d" % k)
    try:
        got, ext = env.from_string(sn).render(**SNIP_CTX), ".txt"
    except Exception as e:
        got, ext = type(e).__name__ + ": " + str(e) + "\n", ".error"
    if "--write" in sys.argv:
        for old_ext in (".txt", ".error"):
            if os.path.exists(base + old_ext): os.remove(base + old_ext)
        open(base + ext, "w", encoding="utf-8", newline="").write(got)
    elif not os.path.exists(base + ext) or open(base + ext, encoding="utf-8", newline="").read() != got:
        differ += 1
        print(f"DIFFER snippet {k}")
    else:
        same += 1
print(f"check_python: {same} agree, {differ} differ")
sys.exit(1 if differ else 0)

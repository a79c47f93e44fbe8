// constrain.test.mjs: constrained decoding over HTTP, checked with a real JSON Schema validator.
// Drives `headroom serve` with response_format (json_schema, json_object) and vLLM's guided_json on
// /v1/completions and /v1/chat/completions: many seeds at temperature 1; every output must end
// "stop", JSON.parse, and validate against its schema with ajv (+ ajv-formats for date, time,
// date-time, uuid). Run by ctest when node exists:
//   node constrain.test.mjs HEADROOM_BIN SCRATCH_DIR MODEL.gguf
// Installs the pinned ajv and ajv-formats into SCRATCH_DIR; exits 77 (skipped) when npm cannot. Every
// wait is bounded.
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';

const [bin, scratch, model] = process.argv.slice(2);
let failed = 0, passed = 0;
const check = (cond, what) => { if (cond) passed++; else { failed++; console.error(`CHECK failed: ${what}`); } };

mkdirSync(scratch, { recursive: true });
if (!existsSync(path.join(scratch, 'node_modules', 'ajv-formats'))) {
  try {
    execFileSync('npm', ['install', '--prefix', scratch, '--no-audit', '--no-fund', 'ajv@8.17.1', 'ajv-formats@3.0.1'],
                 { stdio: 'pipe', timeout: 180000 });
  } catch (e) {
    console.log(`SKIP: npm could not install ajv (${String(e.stderr || e.message).split('\n')[0]})`);
    process.exit(77);
  }
}
const require = createRequire(path.join(scratch, 'package.json'));
const Ajv = require('ajv').default;
const addFormats = require('ajv-formats').default;
const ajv = new Ajv({ strict: false, allErrors: true });
addFormats(ajv);

const srv = spawn(bin, ['serve', '--port', '0', '-m', model, '--ctx', '2048', '--ctx-extend', '-t', '1'],
                  { stdio: ['ignore', 'pipe', 'inherit'] });
const watchdog = setTimeout(() => { console.error('watchdog: 240 s'); srv.kill('SIGKILL'); process.exit(1); }, 240000);
const port = await new Promise((resolve, reject) => {
  let out = '';
  srv.stdout.on('data', (d) => {
    out += d;
    const m = out.match(/listening on \S+:(\d+)/);
    if (m) resolve(Number(m[1]));
  });
  srv.on('exit', (code) => reject(new Error(`headroom serve exited ${code}: ${out}`)));
});
const post = async (route, body) => {
  const r = await fetch(`http://127.0.0.1:${port}${route}`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
    signal: AbortSignal.timeout(60000),
  });
  return { status: r.status, json: await r.json() };
};

const schemas = [
  { type: 'object', properties: {
      name: { type: 'string', maxLength: 12 }, age: { type: 'integer', minimum: 0, maximum: 130 },
      email: { type: 'string', pattern: '^[a-z]{1,8}@[a-z]{1,8}\\.com$' },
      tags: { type: 'array', items: { type: 'string', enum: ['a', 'b', 'c'] }, minItems: 1, maxItems: 3 },
      ok: { type: 'boolean' }, when: { type: 'string', format: 'date' } },
    required: ['name', 'age', 'tags', 'ok'], additionalProperties: false },
  { $defs: { pt: { type: 'object', properties: { x: { type: 'integer', minimum: -50, maximum: 50 }, y: { type: 'number' } },
                   required: ['x', 'y'], additionalProperties: false } },
    type: 'object', properties: {
      kind: { const: 'shape' }, points: { type: 'array', items: { $ref: '#/$defs/pt' }, maxItems: 2 },
      label: { anyOf: [{ type: 'string', maxLength: 8 }, { type: 'null' }] },
      id: { type: 'string', format: 'uuid' }, at: { type: 'string', format: 'date-time' },
      t: { type: 'string', format: 'time' } },
    required: ['kind', 'points', 'label', 'id', 'at'], additionalProperties: false },
  { type: 'array', items: { type: 'integer', exclusiveMinimum: 0, maximum: 9 }, minItems: 2, maxItems: 5 },
  { enum: ['red', 'green', 3, null, { a: [1, 2] }] },
  { type: 'object', properties: { v: { type: ['integer', 'null'] }, s: { type: 'string', minLength: 2, maxLength: 4 } },
    required: ['v', 's'], additionalProperties: false },
];

const SEEDS = 6;
let n = 0;
for (const [si, schema] of schemas.entries()) {
  const validate = ajv.compile(schema);
  const jobs = [];
  for (let seed = 0; seed < SEEDS; seed++) {
    const common = { max_tokens: 1400, temperature: 1, top_p: 1, top_k: 0, min_p: 0, seed: 1000 * si + seed };
    const rf = { type: 'json_schema', json_schema: { name: `s${si}`, schema, strict: true } };
    // three shapes of the same request: OpenAI's chat and completions response_format, vLLM's guided_json
    const req = seed % 3 === 0 ? ['/v1/chat/completions', { ...common, messages: [{ role: 'user', content: 'Give JSON.' }], response_format: rf }]
              : seed % 3 === 1 ? ['/v1/completions', { ...common, prompt: 'Once upon a time', response_format: rf }]
              : ['/v1/completions', { ...common, prompt: 'Once upon a time', guided_json: schema }];
    jobs.push(post(...req).then(({ status, json }) => {
      const c = json.choices?.[0];
      const text = c?.message?.content ?? c?.text;
      check(status === 200 && c?.finish_reason === 'stop', `schema ${si} seed ${seed}: ${status} ${c?.finish_reason} ${JSON.stringify(json).slice(0, 300)}`);
      let v, ok = false;
      try { v = JSON.parse(text); ok = true; } catch (e) { check(false, `schema ${si} seed ${seed}: JSON.parse: ${e.message}: ${text}`); }
      if (ok) check(validate(v), `schema ${si} seed ${seed}: ajv: ${ajv.errorsText(validate.errors)}: ${text}`);
      n++;
    }));
  }
  await Promise.all(jobs); // the seeds of one schema run batched
}

// json_object: any JSON object
for (let seed = 0; seed < SEEDS; seed++) {
  const { status, json } = await post('/v1/chat/completions', {
    messages: [{ role: 'user', content: 'JSON please' }], max_tokens: 1800, temperature: 1, seed,
    response_format: { type: 'json_object' } });
  const c = json.choices?.[0];
  // an unbounded object may run out of tokens: "length" is then the honest ending; a "stop" must parse
  if (c?.finish_reason === 'stop') {
    let v = null;
    try { v = JSON.parse(c.message.content); } catch (e) { check(false, `json_object seed ${seed}: ${e.message}`); }
    check(v !== null && typeof v === 'object' && !Array.isArray(v), `json_object seed ${seed} gives an object`);
  } else {
    check(status === 200 && c?.finish_reason === 'length', `json_object seed ${seed}: ${status} ${c?.finish_reason}`);
  }
}

console.log(`${n} schema outputs validated with ajv; ${passed} passed, ${failed} failed`);
srv.kill('SIGTERM');
clearTimeout(watchdog);
process.exit(failed ? 1 : 0);

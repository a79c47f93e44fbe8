// openai.test.mjs: drives `headroom serve` with the official `openai` npm package (completions, chat,
// streaming with usage, usage.kv, logprobs, errors). Run by ctest when node exists:
//   node openai.test.mjs HEADROOM_BIN SCRATCH_DIR [MODEL.gguf]
// Installs the package into SCRATCH_DIR (npm install --prefix); exits 77 (skipped) when npm cannot
// reach the registry. Every wait is bounded.
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';

const [bin, scratch, model] = process.argv.slice(2);
let failed = 0, passed = 0;
const check = (cond, what) => { if (cond) passed++; else { failed++; console.error(`CHECK failed: ${what}`); } };

mkdirSync(scratch, { recursive: true });
if (!existsSync(path.join(scratch, 'node_modules', 'openai'))) {
  try {
    execFileSync('npm', ['install', '--prefix', scratch, '--no-audit', '--no-fund', 'openai'],
                 { stdio: 'pipe', timeout: 180000 });
  } catch (e) {
    console.log(`SKIP: npm could not install openai (${String(e.stderr || e.message).split('\n')[0]})`);
    process.exit(77);
  }
}
const require = createRequire(path.join(scratch, 'package.json'));
const { default: OpenAI } = await import(require.resolve('openai'));

const args = ['serve', '--port', '0', '--api-key', 'test-key', '--drain-timeout', '2'];
if (model && existsSync(model)) args.push('-m', model);
const srv = spawn(bin, args, { stdio: ['ignore', 'pipe', 'inherit'] });
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
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'test-key', maxRetries: 0, timeout: 60000 });
const models = await client.models.list();
const name = models.data[0].id;
check(typeof name === 'string' && name.length > 0, 'models.list gives the model');

const c = await client.completions.create({ model: name, prompt: 'Once upon a time', max_tokens: 8, temperature: 0 });
check(typeof c.choices[0].text === 'string' && c.usage.completion_tokens > 0, 'completions.create');
check(c.usage.kv && c.usage.kv.bytes_peak > 0 && typeof c.usage.kv.k_format === 'string', 'usage.kv on completions');

const chat = await client.chat.completions.create({
  model: name, messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Tell me a story.' }],
  max_tokens: 8,
});
check(chat.choices[0].message.role === 'assistant' && typeof chat.choices[0].message.content === 'string', 'chat');
check(chat.usage.kv.blocks_peak > 0, 'usage.kv on chat');

const stream = await client.chat.completions.create({
  model: name, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 8, stream: true,
  stream_options: { include_usage: true },
});
let text = '', usage = null, finish = null, chunks = 0;
for await (const chunk of stream) {
  chunks++;
  if (chunk.choices.length) {
    text += chunk.choices[0].delta.content ?? '';
    finish = chunk.choices[0].finish_reason ?? finish;
  }
  if (chunk.usage) usage = chunk.usage;
}
check(chunks >= 3 && finish !== null, `streamed ${chunks} chunks, finish ${finish}`);
check(usage && usage.completion_tokens > 0 && usage.kv.bytes_peak > 0, 'stream usage with kv');

const cstream = await client.completions.create({ model: name, prompt: 'Once', max_tokens: 4, stream: true });
let ctext = '';
for await (const chunk of cstream) ctext += chunk.choices[0]?.text ?? '';
check(typeof ctext === 'string', 'completions stream');

// logprobs through the SDK: greedy chat with top_logprobs, plain and streamed, and completions
const lpReq = {
  model: name, messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 8, temperature: 0,
  presence_penalty: 0, frequency_penalty: 0, logprobs: true, top_logprobs: 3,
};
const lp = await client.chat.completions.create(lpReq);
const lpc = lp.choices[0].logprobs?.content ?? [];
check(lpc.length > 0 && lpc.map((e) => e.token).join('') === lp.choices[0].message.content,
      'chat logprobs tokens spell the content');
check(lpc.every((e) => e.logprob <= 0 && e.top_logprobs.length === 3 && e.top_logprobs[0].token === e.token &&
                       Buffer.from(e.bytes).toString('utf8') === e.token),
      'chat logprobs entries: logprob, bytes, greedy top');
const lps = await client.chat.completions.create({ ...lpReq, stream: true });
const streamed = [];
for await (const chunk of lps) streamed.push(...(chunk.choices[0]?.logprobs?.content ?? []));
check(JSON.stringify(streamed.map((e) => [e.token, e.logprob])) === JSON.stringify(lpc.map((e) => [e.token, e.logprob])),
      'streamed chat logprobs = plain');
const clp = await client.completions.create({ model: name, prompt: 'Once', max_tokens: 4, temperature: 0, logprobs: 2 });
const cl = clp.choices[0].logprobs;
check(cl && cl.tokens.join('') === clp.choices[0].text && cl.token_logprobs.length === cl.tokens.length &&
      cl.top_logprobs.length === cl.tokens.length && cl.text_offset[0] === 0, 'completions logprobs');
try {
  await client.chat.completions.create({ ...lpReq, top_logprobs: 21 });
  check(false, 'top_logprobs 21 is refused');
} catch (e) {
  check(e instanceof OpenAI.BadRequestError && e.param === 'top_logprobs', `400 top_logprobs: ${e}`);
}

try {
  await client.completions.create({ model: name, prompt: 'x', temperature: -1 });
  check(false, 'a negative temperature is refused');
} catch (e) {
  check(e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === 'temperature', `400 error: ${e}`);
}
try {
  await new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'wrong', maxRetries: 0 }).models.list();
  check(false, 'a wrong key is refused');
} catch (e) {
  check(e instanceof OpenAI.AuthenticationError && e.status === 401, `401 error: ${e}`);
}

srv.kill('SIGTERM');
const code = await new Promise((resolve) => srv.on('exit', resolve));
check(code === 0, `headroom serve exits 0 on SIGTERM (got ${code})`);
clearTimeout(watchdog);
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);

// api.test.mjs: the OpenAI fields clients rely on, over plain HTTP (node's fetch, no packages):
// usage.prompt_tokens_details.cached_tokens, /v1/models' max_model_len / context_length, usage.kv
// for n > 1 (shared prompt blocks counted once, never more than the pool), and the refusals of what
// the server does not do (unknown roles, non-text parts, echo/suffix/best_of/tools/...: 400 naming
// the field). Run by ctest:  node api.test.mjs HEADROOM_BIN [MODEL.gguf]. Every wait is bounded.
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';

const [bin, model] = process.argv.slice(2);
let failed = 0, passed = 0;
const check = (cond, what) => { if (cond) passed++; else { failed++; console.error(`CHECK failed: ${what}`); } };

// a tight pool: 1.25 MiB of f16 KV (128 blocks of 16 tokens for stories260K)
const args = ['serve', '--port', '0', '--drain-timeout', '1', '-t', '1', '--kv-budget', '1310720', '--max-running', '8',
  '-c', '1024', '--ctx-extend']; // room for the tools' description in the demo model's tiny vocabulary
if (model && existsSync(model)) args.push('-m', model);
const srv = spawn(bin, args, { stdio: ['ignore', 'pipe', 'inherit'] });
process.on('exit', () => srv.kill('SIGKILL')); // also when a check throws
const watchdog = setTimeout(() => { console.error('watchdog: 120 s'); srv.kill('SIGKILL'); process.exit(1); }, 120000);
const port = await new Promise((resolve, reject) => {
  let out = '';
  srv.stdout.on('data', (d) => { out += d; const m = out.match(/listening on \S+:(\d+)/); if (m) resolve(Number(m[1])); });
  srv.on('exit', (code) => reject(new Error(`headroom serve exited ${code}: ${out}`)));
});
const base = `http://127.0.0.1:${port}`;
const post = async (path, body) => {
  const r = await fetch(base + path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return { status: r.status, json: await r.json() };
};
for (let i = 0; i < 300; i++) { try { if ((await fetch(base + '/health')).ok) break; } catch {} await new Promise((r) => setTimeout(r, 200)); }

// /v1/models: the context, under vLLM's name and the plain one
const models = await (await fetch(base + '/v1/models')).json();
const m0 = models.data[0];
check(m0.max_model_len > 0 && m0.context_length === m0.max_model_len && m0.max_model_len === m0.meta.n_ctx,
      `/v1/models max_model_len/context_length: ${JSON.stringify(m0)}`);
const budget = m0.meta.kv_budget_bytes;

// cached_tokens: a prompt of whole blocks plus a tail, twice: the second takes the full blocks from the cache
const prompt = 'Once upon a time there was a little girl named Lily. She liked to play outside with her friends. '.repeat(4);
const a = await post('/v1/completions', { prompt, max_tokens: 4, temperature: 0 });
const b = await post('/v1/completions', { prompt, max_tokens: 4, temperature: 0 });
check(a.status === 200 && a.json.usage.prompt_tokens_details.cached_tokens === 0, `first: cached_tokens 0: ${JSON.stringify(a.json.usage)}`);
const bs = m0.meta.block_size, np = b.json.usage.prompt_tokens;
check(b.json.usage.prompt_tokens_details.cached_tokens === b.json.usage.kv.prefix_hit_tokens &&
      b.json.usage.prompt_tokens_details.cached_tokens >= Math.floor((np - 1) / bs) * bs - bs &&
      b.json.usage.prompt_tokens_details.cached_tokens > 0,
      `second: cached_tokens = prefix hits: ${JSON.stringify(b.json.usage)}`);
const chat = await post('/v1/chat/completions', { messages: [{ role: 'user', content: 'Hi' }], max_tokens: 2 });
check(chat.status === 200 && Number.isInteger(chat.json.usage.prompt_tokens_details.cached_tokens), 'chat usage has cached_tokens');

// n = 8 on one prompt: the prompt's full blocks are shared; usage.kv counts each block once
const p8 = 'The dog ran to the park and saw a big red ball. '.repeat(8);
// its full blocks into the prefix cache
const n8 = (await post('/v1/completions', { prompt: p8, max_tokens: 1 })).json.usage.prompt_tokens;
// max_tokens such that the choices end mid-block (prompt + output - 1 computed tokens at the last step):
// a choice admitted a few steps after the others still holds as many blocks when the first finish
const mt = bs + ((((bs / 2 - n8 + 1) % bs) + bs) % bs);
const r8 = await post('/v1/completions', { prompt: p8, n: 8, max_tokens: mt, temperature: 1, ignore_eos: true });
check(r8.status === 200 && r8.json.choices.length === 8 && r8.json.usage.prompt_tokens === n8, `n=8: ${r8.status}`);
const kv8 = r8.json.usage.kv;
const r1 = await post('/v1/completions', { prompt: p8 + ' x', max_tokens: mt, temperature: 1, ignore_eos: true });
const kv1 = r1.json.usage.kv, blockBytes = kv1.bytes_peak / kv1.blocks_peak;
const each = Math.ceil((n8 + mt - 1) / bs); // blocks one choice holds at its last step
check(kv8.bytes_peak <= budget, `n=8 bytes_peak ${kv8.bytes_peak} exceeds the pool ${budget}`);
check(kv8.bytes_peak === kv8.blocks_peak * blockBytes, `n=8 bytes_peak is blocks_peak blocks: ${JSON.stringify(kv8)}`);
// the prompt's full blocks were cached, so every choice takes them from the cache and computes only
// its partial block and its output: the 8 choices hold the full prompt blocks once and their own
// blocks each, all at the last step (one max_tokens, ignore_eos, admitted together)
const full = Math.floor(n8 / bs);
check(kv8.prefix_hit_tokens === 8 * full * bs, `every choice hit the cached prompt: ${kv8.prefix_hit_tokens} hits, want ${8 * full * bs}`);
const want = full + 8 * (each - full);
check(kv8.blocks_peak === want && kv8.blocks_at_finish === want,
      `n=8 blocks_peak ${kv8.blocks_peak} / at finish ${kv8.blocks_at_finish}: want ${want} (prompt ${n8} tokens, block ${bs}; the sum of the choices' peaks is ${8 * each})`);
check(kv8.blocks_at_finish <= kv8.blocks_peak, `n=8 blocks_at_finish ${kv8.blocks_at_finish} <= peak`);

// logit_bias: -100 bans the greedy choice; +100 on another token makes it the greedy choice (the output's
// ids: the tokens of prompt + text past those of the prompt)
const ids = async (text) => (await post('/tokenize', { content: text })).json.tokens;
const outIds = async (text) => (await ids('Once upon a time' + text)).slice((await ids('Once upon a time')).length);
const g0 = await post('/v1/completions', { prompt: 'Once upon a time', max_tokens: 1, temperature: 0 });
const [firstTok] = await outIds(g0.json.choices[0].text);
const banned = await post('/v1/completions', { prompt: 'Once upon a time', max_tokens: 1, temperature: 0, logit_bias: { [firstTok]: -100 } });
check(banned.status === 200 && banned.json.choices[0].text !== g0.json.choices[0].text,
      `logit_bias -100 bans token ${firstTok} ('${g0.json.choices[0].text}'): got '${banned.json.choices[0].text}'`);
const piece = (await post('/detokenize', { tokens: [100] })).json.content;
const forced = await post('/v1/completions', { prompt: 'Once upon a time', max_tokens: 3, temperature: 0, logit_bias: { 100: 100 } });
check(forced.status === 200 && piece.length > 0 && forced.json.choices[0].text === piece.repeat(3),
      `logit_bias +100 forces token 100 ('${piece}'): '${forced.json.choices[0].text}'`);
for (const bias of [{ abc: 1 }, { 5: 200 }, { 5: 'x' }, { 99999999: 1 }, [1, 2], { '-1': 5 }]) {
  const r = await post('/v1/completions', { prompt: 'a', max_tokens: 1, logit_bias: bias });
  check(r.status === 400 && r.json.error.param === 'logit_bias', `logit_bias ${JSON.stringify(bias)}: want 400 logit_bias, got ${r.status} ${JSON.stringify(r.json)}`);
}

// what the server does not do is refused, naming the field
const refused = [
  ['/v1/completions', { prompt: 'a', echo: true }, 'echo', 'unsupported_parameter'],
  ['/v1/completions', { prompt: 'a', suffix: 'b' }, 'suffix', 'unsupported_parameter'],
  ['/v1/completions', { prompt: 'a', best_of: 3 }, 'best_of', 'unsupported_parameter'],
  ['/v1/completions', { prompt: 'a', tools: [{ type: 'function', function: { name: 'f' } }] }, 'tools', 'unsupported_parameter'],
  ['/v1/chat/completions', { messages: [{ role: 'user', content: 'a' }], tools: [{ type: 'function', function: { description: 'no name' } }] }, 'tools', 'invalid_value'],
  ['/v1/chat/completions', { messages: [{ role: 'user', content: 'a' }], tools: [{ type: 'function', function: { name: 'f' } }], tool_choice: { type: 'function', function: { name: 'g' } } }, 'tool_choice', 'invalid_value'],
  ['/v1/chat/completions', { messages: [{ role: 'user', content: 'a' }], tool_choice: 'required' }, 'tool_choice', 'invalid_value'],
  ['/v1/chat/completions', { messages: [{ role: 'user', content: 'a', tool_calls: [{ id: 'c', type: 'function', function: { name: 'f', arguments: '{}' } }] }] }, 'messages', 'invalid_value'],
  ['/v1/chat/completions', { messages: [{ role: 'assistant', content: null, tool_calls: [{ id: 'c', type: 'function', function: { name: 'f', arguments: 'not json' } }] }] }, 'messages', 'invalid_value'],
  ['/v1/chat/completions', { messages: [{ role: 'user', content: 'a' }], modalities: ['text', 'audio'] }, 'modalities', 'unsupported_parameter'],
  ['/v1/chat/completions', { messages: [{ role: 'wizard', content: 'a' }] }, 'messages', 'invalid_value'],
  ['/v1/chat/completions', { messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'http://x/y.png' } }] }] }, 'messages', 'unsupported_content'],
  ['/v1/chat/completions', { messages: [{ role: 'user', content: [{ type: 'input_audio', input_audio: { data: '', format: 'wav' } }] }] }, 'messages', 'unsupported_content'],
];
for (const [path, body, param, code] of refused) {
  const r = await post(path, body);
  check(r.status === 400 && r.json.error.param === param && r.json.error.code === code,
        `${JSON.stringify(body)}: want 400 ${param}/${code}, got ${r.status} ${JSON.stringify(r.json)}`);
}
const imageMsg = (await post('/v1/chat/completions', { messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }] })).json.error.message;
check(/text only/.test(imageMsg), `an image part says the model takes text only: ${imageMsg}`);
// tools with a history of calls and results are rendered and answered (the demo model's answer is prose:
// content, finish_reason length), streaming too; what may start a call is never sent as content
const toolBody = {
  messages: [{ role: 'user', content: 'Weather?' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '22 C' }],
  tools: [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }],
  max_tokens: 6, temperature: 0,
};
const tr = await post('/v1/chat/completions', toolBody);
check(tr.status === 200 && typeof tr.json.choices[0].message.content === 'string' && tr.json.choices[0].finish_reason === 'length',
      `chat with tools and a call history: ${tr.status} ${JSON.stringify(tr.json).slice(0, 300)}`);
const ts = await fetch(base + '/v1/chat/completions', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...toolBody, stream: true }) });
const events = (await ts.text()).split('\n\n').filter((x) => x.startsWith('data: {')).map((x) => JSON.parse(x.slice(6)));
const streamed = events.map((c) => c.choices[0]?.delta?.content || '').join('');
check(ts.status === 200 && streamed === tr.json.choices[0].message.content && events.at(-1).choices[0].finish_reason === 'length',
      `streamed with tools: '${streamed}' vs '${tr.json.choices[0].message.content}'`);

// tool_choice "required" / a named function: the answer is constrained to calls whose arguments follow
// the tool's parameters (temperature 1, several seeds, the demo model's noise notwithstanding)
const weather = { type: 'function', function: { name: 'get_weather', parameters: { type: 'object', additionalProperties: false,
  properties: { city: { type: 'string', maxLength: 12 }, days: { type: 'integer', minimum: 1, maximum: 7 } }, required: ['city', 'days'] } } };
const adder = { type: 'function', function: { name: 'add', parameters: { type: 'object', properties: { a: { type: 'integer' } }, required: ['a'] } } };
const validArgs = (name, args) => name === 'add' ? Number.isInteger(args.a)
  : typeof args.city === 'string' && [...args.city].length <= 12 && Number.isInteger(args.days) && args.days >= 1 && args.days <= 7 &&
    Object.keys(args).every((k) => k === 'city' || k === 'days');
for (let seed = 0; seed < 6; seed++) {
  for (const choice of ['required', { type: 'function', function: { name: 'get_weather' } }]) {
    const r = await post('/v1/chat/completions', { messages: [{ role: 'user', content: 'Weather?' }], tools: [weather, adder],
      tool_choice: choice, parallel_tool_calls: false, max_tokens: 120, temperature: 1, seed });
    const m = r.json.choices?.[0]?.message, calls = m?.tool_calls || [];
    const ok = r.status === 200 && r.json.choices[0].finish_reason === 'tool_calls' && m.content === null && calls.length === 1 &&
      /^call_[A-Za-z0-9]{24}$/.test(calls[0].id) && calls[0].type === 'function' &&
      (typeof choice === 'string' || calls[0].function.name === 'get_weather') &&
      validArgs(calls[0].function.name, JSON.parse(calls[0].function.arguments));
    check(ok, `tool_choice ${JSON.stringify(choice)} seed ${seed}: ${r.status} ${JSON.stringify(r.json).slice(0, 400)}`);
  }
}
const tsr = await fetch(base + '/v1/chat/completions', { method: 'POST', headers: { 'content-type': 'application/json' },
  body: JSON.stringify({ messages: [{ role: 'user', content: 'Weather?' }], tools: [weather], tool_choice: 'required',
    parallel_tool_calls: false, max_tokens: 120, temperature: 1, seed: 1, stream: true }) });
const tev = (await tsr.text()).split('\n\n').filter((x) => x.startsWith('data: {')).map((x) => JSON.parse(x.slice(6)));
const deltas = tev.flatMap((c) => c.choices[0]?.delta?.tool_calls || []);
// OpenAI's order: index, id, type and name with empty arguments, then the argument fragments
check(deltas.length === 2 && deltas.every((d) => d.index === 0) && deltas[0].function.name === 'get_weather' &&
      /^call_/.test(deltas[0].id) && deltas[0].type === 'function' && deltas[0].function.arguments === '' && !deltas[1].id &&
      validArgs('get_weather', JSON.parse(deltas.map((d) => d.function.arguments).join(''))) && tev.at(-1).choices[0].finish_reason === 'tool_calls' &&
      tev.every((c) => !c.choices[0]?.delta?.content),
      `streamed tool call: ${JSON.stringify(deltas)} ${JSON.stringify(tev.at(-1))}`);
const both = await post('/v1/chat/completions', { messages: [{ role: 'user', content: 'a' }], tools: [weather], tool_choice: 'required',
  response_format: { type: 'json_object' } });
check(both.status === 400 && both.json.error.param === 'tool_choice', `tool_choice required with response_format: ${JSON.stringify(both.json)}`);

// fields at their "off" values ask for nothing
const offs = [
  ['/v1/completions', { prompt: 'a', max_tokens: 1, echo: false, suffix: '', best_of: 1 }],
  ['/v1/chat/completions', { messages: [{ role: 'user', content: 'a' }], max_tokens: 1, tools: [], tool_choice: 'none', response_format: { type: 'text' }, modalities: ['text'] }],
  ['/v1/chat/completions', { messages: [{ role: 'developer', content: 'a' }, { role: 'user', content: [{ type: 'text', text: 'b' }] }], max_tokens: 1 }],
];
for (const [path, body] of offs) {
  const r = await post(path, body);
  check(r.status === 200, `${JSON.stringify(body)}: want 200, got ${r.status} ${JSON.stringify(r.json)}`);
}

clearTimeout(watchdog);
srv.kill('SIGTERM');
await new Promise((r) => srv.on('exit', r));
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);

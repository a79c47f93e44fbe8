// load.mjs: N concurrent streaming clients against a running `headroom serve` (or any OpenAI-compatible
// server): each sends one /v1/completions request with stream true and counts the tokens as they
// arrive. Prints one JSON line: aggregate generated tokens/s over the wall time, TTFT and
// inter-token latency percentiles (ms), errors. Plain fetch (Node >= 18), no packages.
//   node bench/serve/load.mjs URL CLIENTS MAX_TOKENS [PROMPT]
const [url, clientsArg, maxArg, promptArg] = process.argv.slice(2);
if (!url || !clientsArg || !maxArg) {
  console.error('usage: node load.mjs URL CLIENTS MAX_TOKENS [PROMPT]');
  process.exit(2);
}
const clients = Number(clientsArg), maxTokens = Number(maxArg);
const prompt = promptArg || 'Once upon a time';

async function one(i) {
  const t0 = performance.now();
  const res = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: `${prompt} ${i}`, max_tokens: maxTokens, stream: true, temperature: 0,
                           ignore_eos: true, stream_options: { include_usage: true } }),
  });
  if (!res.ok) return { error: `${res.status}` };
  const dec = new TextDecoder();
  let buf = '', ttft = 0, last = 0, tokens = 0;
  const itl = [];
  for await (const chunk of res.body) {
    buf += dec.decode(chunk, { stream: true });
    let k;
    while ((k = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, k);
      buf = buf.slice(k + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const o = JSON.parse(ev.slice(6));
      if (o.usage) tokens = o.usage.completion_tokens;
      if (!o.choices || o.choices.length === 0) continue;
      const now = performance.now();
      if (!ttft) ttft = now - t0; else itl.push(now - last);
      last = now;
    }
  }
  return { ttft, itl, tokens };
}

const pct = (a, p) => (a.length ? a.slice().sort((x, y) => x - y)[Math.min(a.length - 1, Math.floor(p * a.length))] : 0);
const t0 = performance.now();
const rs = await Promise.all(Array.from({ length: clients }, (_, i) => one(i).catch((e) => ({ error: String(e) }))));
const secs = (performance.now() - t0) / 1000;
const ok = rs.filter((r) => !r.error);
const tokens = ok.reduce((s, r) => s + r.tokens, 0);
const itl = ok.flatMap((r) => r.itl), ttft = ok.map((r) => r.ttft);
console.log(JSON.stringify({
  clients, max_tokens: maxTokens, seconds: +secs.toFixed(3), generated_tokens: tokens,
  tokens_per_second: +(tokens / secs).toFixed(2),
  ttft_ms_p50: +pct(ttft, 0.5).toFixed(1), ttft_ms_p99: +pct(ttft, 0.99).toFixed(1),
  itl_ms_p50: +pct(itl, 0.5).toFixed(1), itl_ms_p99: +pct(itl, 0.99).toFixed(1),
  errors: rs.length - ok.length,
}));

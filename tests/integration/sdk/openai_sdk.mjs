// The official OpenAI Node SDK against Strata's OpenAI-compatible API: models, chat (plain,
// streamed with usage, a tool-call round trip: the tools declared, the assistant's tool_calls and
// the tool's result sent back), completions (plain and streamed), and errors as the SDK's typed
// exceptions. Exits 1 on any failed check.
//   node openai_sdk.mjs http://HOST:PORT/v1 MODEL
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 60000 });
let passed = 0, failed = 0;
function check(what, cond) {
  if (cond) { passed++; console.log("ok  ", what); } else { failed++; console.log("FAIL", what); }
}
async function expectError(what, fn, Type, status, param) {
  try {
    await fn();
    check(`${what}: refused`, false);
  } catch (e) {
    check(`${what}: ${Type.name} ${status}${param ? ` (param ${param})` : ""}`,
      e instanceof Type && e.status === status && (!param || e.param === param) && typeof e.message === "string");
  }
}

const models = await client.models.list();
check("models.list has the served model", models.data.some((m) => m.id === model && m.object === "model"));

const chat = await client.chat.completions.create({ model, messages: [{ role: "user", content: "Hello!" }],
  max_completion_tokens: 4, temperature: 0 });
check("chat: one choice with the assistant's message", chat.object === "chat.completion" && chat.choices.length === 1 &&
  chat.choices[0].message.role === "assistant" && typeof chat.choices[0].message.content === "string");
check("chat: usage", chat.usage.prompt_tokens > 0 && chat.usage.completion_tokens >= 1 &&
  chat.usage.total_tokens === chat.usage.prompt_tokens + chat.usage.completion_tokens);

const stream = await client.chat.completions.create({ model, messages: [{ role: "user", content: "Count to three." }],
  max_tokens: 6, stream: true, stream_options: { include_usage: true }, ignore_eos: true });
let text = "", usage = null, finish = null, n = 0;
for await (const c of stream) {
  n++;
  if (c.usage) usage = c.usage;
  for (const ch of c.choices) {
    text += ch.delta.content ?? "";
    finish = ch.finish_reason ?? finish;
  }
}
check("chat stream: chunks and a finish_reason", n >= 2 && finish === "length");
check("chat stream: usage in the last chunk", usage && usage.completion_tokens === 6);

const tools = [{ type: "function", function: { name: "get_weather", description: "Weather in a city",
  parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } }];
const first = await client.chat.completions.create({ model, tools, max_tokens: 4,
  messages: [{ role: "user", content: "What is the weather in Paris?" }] });
const fr = first.choices[0].finish_reason;
check("tools: an answer (text or tool_calls)", ["stop", "length", "tool_calls"].includes(fr));
// the round trip: the assistant's call and the tool's result go back to the model
const call = first.choices[0].message.tool_calls?.[0] ??
  { id: "functions.get_weather:0", type: "function", function: { name: "get_weather", arguments: "{\"city\": \"Paris\"}" } };
const second = await client.chat.completions.create({ model, tools, max_tokens: 4, messages: [
  { role: "user", content: "What is the weather in Paris?" },
  { role: "assistant", content: null, tool_calls: [call] },
  { role: "tool", tool_call_id: call.id, content: "{\"temperature_c\": 18}" }] });
check("tools: the tool's result is accepted and answered",
  second.choices.length === 1 && second.usage.prompt_tokens > first.usage.prompt_tokens);

const two = await client.chat.completions.create({ model, messages: [{ role: "user", content: "Hi" }], n: 2,
  max_tokens: 3, ignore_eos: true, logprobs: true, top_logprobs: 2, stop: ["@@@@"], presence_penalty: 0.5,
  logit_bias: { "65": 1 } });
check("chat n = 2 with logprobs, stop, penalties, logit_bias", two.choices.length === 2 &&
  two.choices.every((c, i) => c.index === i && c.logprobs.content.length >= 1 &&
    c.logprobs.content.every((e) => typeof e.logprob === "number" && e.top_logprobs.length === 2)));

const cmpl = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 5, ignore_eos: true });
check("completions: text and usage", cmpl.object === "text_completion" && typeof cmpl.choices[0].text === "string" &&
  cmpl.usage.completion_tokens === 5);
const cstream = await client.completions.create({ model, prompt: "Once", max_tokens: 3, stream: true, ignore_eos: true });
let cn = 0;
for await (const c of cstream) cn += c.choices.length;
check("completions stream", cn >= 1);

await expectError("another model", () => client.chat.completions.create({ model: "nope",
  messages: [{ role: "user", content: "x" }] }), OpenAI.BadRequestError, 400, "model");
await expectError("empty messages", () => client.chat.completions.create({ model, messages: [] }),
  OpenAI.BadRequestError, 400, "messages");
await expectError("max_tokens 0", () => client.completions.create({ model, prompt: "x", max_tokens: 0 }),
  OpenAI.BadRequestError, 400, "max_tokens");
await expectError("an unknown route", () => client.get("/nowhere"), OpenAI.NotFoundError, 404);
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);

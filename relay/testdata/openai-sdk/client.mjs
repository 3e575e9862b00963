// The official OpenAI JS SDK against a relay, as a user's script calls it.
// Each case prints one JSON line: {"case": name, ...what it saw} or
// {"case": name, "error": {...}}; the Go test (e2e_openai_sdk_test.go)
// decides whether that is right. Environment: OPENAI_BASE_URL (the relay's
// /v1), OPENAI_API_KEY (a relay client key), MODEL.
import OpenAI from "openai";

const client = new OpenAI({ maxRetries: 0, timeout: 30_000 });
const model = process.env.MODEL;
const tools = [{
  type: "function",
  function: {
    name: "get_weather",
    description: "Weather of a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  },
}];
const askWeather = { role: "user", content: 'Weather in Paris? [[sim:tool get_weather {"city":"Paris"}]]' };

const cases = {
  async responses_json() {
    const r = await client.responses.create({ model, input: "Say hello." });
    return { id: r.id, object: r.object, status: r.status, text: r.output_text };
  },
  async responses_stream() {
    const stream = await client.responses.create({
      model, stream: true, input: [{ role: "user", content: "Stream this." }],
    });
    let text = "";
    const types = [];
    let id = "";
    for await (const ev of stream) {
      types.push(ev.type);
      if (ev.type === "response.output_text.delta") text += ev.delta;
      if (ev.type === "response.completed") id = ev.response.id;
    }
    return { id, text, last: types[types.length - 1] };
  },
  async models_list() {
    const ids = [];
    for await (const m of client.models.list()) ids.push(m.id);
    return { ids };
  },
  async chat_json() {
    const c = await client.chat.completions.create({
      model, messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Say hello." }],
    });
    const choice = c.choices[0];
    return { id: c.id, object: c.object, text: choice.message.content, finish_reason: choice.finish_reason, usage: c.usage };
  },
  async chat_stream() {
    const stream = await client.chat.completions.create({
      model, stream: true, stream_options: { include_usage: true },
      messages: [{ role: "user", content: "Stream please." }],
    });
    let text = "";
    let role = "";
    let finish = null;
    let usage = null;
    let chunks = 0;
    for await (const chunk of stream) {
      chunks++;
      if (chunk.usage) usage = chunk.usage;
      for (const choice of chunk.choices) {
        if (choice.delta.role) role = role || choice.delta.role;
        if (choice.delta.content) text += choice.delta.content;
        if (choice.finish_reason) finish = choice.finish_reason;
      }
    }
    return { text, role, finish_reason: finish, usage, chunks };
  },
  async chat_tools() {
    const first = await client.chat.completions.create({ model, tools, messages: [askWeather] });
    const msg = first.choices[0].message;
    const call = msg.tool_calls[0];
    // The SDK's own stream helper assembles the streamed tool call.
    const runner = client.chat.completions.stream({ model, tools, messages: [askWeather] });
    const streamed = await runner.finalChatCompletion();
    const streamedCall = streamed.choices[0].message.tool_calls[0];
    const second = await client.chat.completions.create({
      model, tools,
      messages: [askWeather, msg, { role: "tool", tool_call_id: call.id, content: "sunny, 24 degrees" }],
    });
    return {
      finish_reason: first.choices[0].finish_reason,
      call: { id: call.id, name: call.function.name, arguments: call.function.arguments },
      streamed_finish_reason: streamed.choices[0].finish_reason,
      streamed_call: { id: streamedCall.id, name: streamedCall.function.name, arguments: streamedCall.function.arguments },
      answer: second.choices[0].message.content,
    };
  },
  async chat_error() {
    await client.chat.completions.create({ model, messages: [] });
    return { unexpected: "no error" };
  },
};

for (const [name, run] of Object.entries(cases)) {
  let line;
  try {
    line = { case: name, ...(await run()) };
  } catch (err) {
    line = { case: name, error: { status: err.status ?? null, message: err.message, code: err.code ?? null, param: err.param ?? null, type: err.type ?? null, name: err.constructor?.name } };
  }
  process.stdout.write(JSON.stringify(line) + "\n");
}

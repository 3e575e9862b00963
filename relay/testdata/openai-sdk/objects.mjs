// The official OpenAI JS SDK's object calls against a relay: files,
// images, embeddings and a background response, as a user's script makes
// them. Each case prints one JSON line, {"case": name, ...what it saw} or
// {"case": name, "error": {...}}; the Go test (e2e_objects_test.go)
// decides whether that is right. Environment: OPENAI_BASE_URL (the
// relay's /v1), OPENAI_API_KEY (a relay client key), MODEL.
import OpenAI, { toFile } from "openai";

const client = new OpenAI({ maxRetries: 0, timeout: 30_000 });
const model = process.env.MODEL;
const content = "a file made by the JS SDK\n".repeat(100);
let fileID = "";

const cases = {
  async files_create() {
    const f = await client.files.create({ file: await toFile(Buffer.from(content), "notes.txt"), purpose: "user_data" });
    fileID = f.id;
    return { id: f.id, object: f.object, bytes: f.bytes, filename: f.filename };
  },
  async files_retrieve() {
    const f = await client.files.retrieve(fileID);
    return { id: f.id, bytes: f.bytes };
  },
  async files_list() {
    const ids = [];
    for await (const f of client.files.list()) ids.push(f.id);
    return { ids };
  },
  async files_content() {
    const r = await client.files.content(fileID);
    const text = await r.text();
    return { same: text === content, length: text.length };
  },
  async responses_with_file() {
    const r = await client.responses.create({
      model,
      input: [{ role: "user", content: [{ type: "input_file", file_id: fileID }, { type: "input_text", text: "Summarise it." }] }],
    });
    return { id: r.id, status: r.status };
  },
  async files_delete() {
    const d = await client.files.delete(fileID);
    return { id: d.id, deleted: d.deleted };
  },
  async files_gone() {
    await client.files.retrieve(fileID);
    return { unexpected: "no error" };
  },
  async images_generate() {
    const r = await client.images.generate({ model: "gpt-image-1.5", prompt: "a lighthouse at dawn", n: 2, size: "1024x1024" });
    return { images: r.data.length, b64: r.data.every((d) => (d.b64_json ?? "").length > 0) };
  },
  async images_edit() {
    const png = Buffer.from("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII=", "base64");
    const r = await client.images.edit({ model: "gpt-image-1.5", image: await toFile(png, "in.png", { type: "image/png" }), prompt: "make it night" });
    return { images: r.data.length };
  },
  async embeddings() {
    const r = await client.embeddings.create({ model: "text-embedding-3-small", input: ["one", "two"] });
    return { vectors: r.data.length, dims: r.data[0].embedding.length, tokens: r.usage.total_tokens };
  },
  async background() {
    let r = await client.responses.create({ model, background: true, store: true, input: "[[sim:words 4]] later" });
    const id = r.id;
    const first = r.status;
    for (let i = 0; i < 500 && r.status !== "completed"; i++) {
      await new Promise((ok) => setTimeout(ok, 20));
      r = await client.responses.retrieve(id);
    }
    const items = await client.responses.inputItems.list(id);
    return { id, first, status: r.status, text: r.output_text, items: items.data.length };
  },
};

for (const [name, run] of Object.entries(cases)) {
  let line;
  try {
    line = { case: name, ...(await run()) };
  } catch (err) {
    line = { case: name, error: { status: err.status ?? null, message: err.message, code: err.code ?? null, type: err.type ?? null } };
  }
  process.stdout.write(JSON.stringify(line) + "\n");
}

"""The official OpenAI Python SDK against a relay, as a user's script calls it.

Each case prints one JSON line: {"case": name, ...what it saw} or
{"case": name, "error": {...}}; the Go test (e2e_openai_sdk_test.go) decides
whether that is right. Environment: OPENAI_BASE_URL (the relay's /v1),
OPENAI_API_KEY (a relay client key), MODEL.
"""

import json
import os
import sys

import openai

client = openai.OpenAI(max_retries=0, timeout=30)
model = os.environ["MODEL"]
tools = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]
ask_weather = {"role": "user", "content": 'Weather in Paris? [[sim:tool get_weather {"city":"Paris"}]]'}


def usage_of(u):
    return None if u is None else u.model_dump()


def responses_json():
    r = client.responses.create(model=model, input="Say hello.")
    return {"id": r.id, "object": r.object, "status": r.status, "text": r.output_text}


def responses_stream():
    text, last, rid = "", "", ""
    for ev in client.responses.create(model=model, stream=True, input=[{"role": "user", "content": "Stream this."}]):
        last = ev.type
        if ev.type == "response.output_text.delta":
            text += ev.delta
        if ev.type == "response.completed":
            rid = ev.response.id
    return {"id": rid, "text": text, "last": last}


def models_list():
    return {"ids": [m.id for m in client.models.list()]}


def chat_json():
    c = client.chat.completions.create(
        model=model, messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}])
    choice = c.choices[0]
    return {"id": c.id, "object": c.object, "text": choice.message.content,
            "finish_reason": choice.finish_reason, "usage": usage_of(c.usage)}


def chat_stream():
    text, role, finish, usage, chunks = "", "", None, None, 0
    for chunk in client.chat.completions.create(
            model=model, stream=True, stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "Stream please."}]):
        chunks += 1
        if chunk.usage is not None:
            usage = usage_of(chunk.usage)
        for choice in chunk.choices:
            if choice.delta.role and not role:
                role = choice.delta.role
            if choice.delta.content:
                text += choice.delta.content
            if choice.finish_reason:
                finish = choice.finish_reason
    return {"text": text, "role": role, "finish_reason": finish, "usage": usage, "chunks": chunks}


def chat_tools():
    first = client.chat.completions.create(model=model, tools=tools, messages=[ask_weather])
    msg = first.choices[0].message
    call = msg.tool_calls[0]
    # The SDK's own stream helper assembles the streamed tool call.
    with client.chat.completions.stream(model=model, tools=tools, messages=[ask_weather]) as stream:
        for _ in stream:
            pass
        streamed = stream.get_final_completion()
    streamed_call = streamed.choices[0].message.tool_calls[0]
    second = client.chat.completions.create(model=model, tools=tools, messages=[
        ask_weather, msg.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 24 degrees"}])
    return {
        "finish_reason": first.choices[0].finish_reason,
        "call": {"id": call.id, "name": call.function.name, "arguments": call.function.arguments},
        "streamed_finish_reason": streamed.choices[0].finish_reason,
        "streamed_call": {"id": streamed_call.id, "name": streamed_call.function.name,
                          "arguments": streamed_call.function.arguments},
        "answer": second.choices[0].message.content,
    }


def chat_error():
    client.chat.completions.create(model=model, messages=[])
    return {"unexpected": "no error"}


for name, run in [("responses_json", responses_json), ("responses_stream", responses_stream),
                  ("models_list", models_list), ("chat_json", chat_json), ("chat_stream", chat_stream),
                  ("chat_tools", chat_tools), ("chat_error", chat_error)]:
    try:
        line = {"case": name, **run()}
    except openai.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        line = {"case": name, "error": {"status": e.status_code, "message": body.get("message", str(e)),
                                        "code": body.get("code"), "param": body.get("param"),
                                        "type": body.get("type"), "name": type(e).__name__}}
    except Exception as e:  # a client-side failure: the SDK could not read the answer
        line = {"case": name, "error": {"status": None, "message": str(e), "name": type(e).__name__}}
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()

// The chat page of GET /: one static file, no external resources. It streams a chat
// completion from this server and shows the reply as it comes, with live figures.
#include "serve/server.h"

namespace npurt::serve {

const char* const kChatPage = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>npurt chat</title>
<style>
body { font-family: sans-serif; max-width: 46em; margin: 2em auto; padding: 0 1em; }
#log { white-space: pre-wrap; border: 1px solid #ccc; padding: 1em; min-height: 12em; }
.user { color: #225; font-weight: bold; }
textarea { width: 100%; height: 5em; }
#figures { color: #555; font-size: 0.9em; }
</style>
</head>
<body>
<h1>npurt chat</h1>
<div id="log"></div>
<p><textarea id="prompt" placeholder="Write a message"></textarea></p>
<p><button id="send">Send</button> <span id="figures"></span></p>
<script>
const messages = [];
const log = document.getElementById("log");
const figures = document.getElementById("figures");
const button = document.getElementById("send");
const box = document.getElementById("prompt");
// log.dataset.state: "answering" while a reply streams, "done" after it (or its error).
async function send() {
  const text = box.value.trim();
  if (!text || button.disabled) return;
  box.value = "";
  button.disabled = true;
  log.dataset.state = "answering";
  try {
    await stream_reply(text);
  } catch (e) {
    log.appendChild(document.createTextNode("error: " + e));
  } finally {
    button.disabled = false;
    log.dataset.state = "done";
  }
}
async function stream_reply(text) {
  messages.push({role: "user", content: text});
  const who = document.createElement("div");
  who.className = "user";
  who.textContent = "> " + text;
  log.appendChild(who);
  const reply = document.createElement("div");
  log.appendChild(reply);
  const start = performance.now();
  let first = 0, tokens = 0, answer = "";
  const res = await fetch("/v1/chat/completions", {
    method: "POST", headers: {"Content-Type": "application/json"},
    body: JSON.stringify({messages, stream: true, max_tokens: 256, temperature: 0})});
  if (!res.ok) { reply.textContent = "error " + res.status + ": " + await res.text(); return; }
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, {stream: true});
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      if (!event.startsWith("data: ") || event === "data: [DONE]") continue;
      const chunk = JSON.parse(event.slice(6));
      const piece = chunk.choices && chunk.choices[0] && chunk.choices[0].delta.content;
      if (!piece) continue;
      if (!first) first = performance.now();
      tokens += 1;
      answer += piece;
      reply.textContent = answer;
      const secs = (performance.now() - first) / 1000;
      figures.textContent = "first token " + ((first - start) / 1000).toFixed(2) + " s, " + tokens +
          " tokens" + (secs > 0 ? ", " + (tokens / secs).toFixed(1) + " tokens/s" : "");
    }
  }
  messages.push({role: "assistant", content: answer});
}
button.onclick = send;
// Enter sends; Shift+Enter starts a new line.
box.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); send(); }
});
</script>
</body>
</html>
)HTML";

}  // namespace npurt::serve

// The playground: each message goes to both panes' models at once, each answer streamed from
// the dashboard's chat endpoint (server-sent events, as the inference API streams them) into its
// pane. Each pane keeps its own conversation. A cold model answers 503 `model_starting`: the
// pane says "starting…" and asks again until it answers.
"use strict";

const STARTING_FOR_MS = 10 * 60 * 1000; // a replica that is not up by then is reported

function paneState(section) {
  return {
    section,
    model: section.querySelector("[data-pane-model]"),
    conversation: section.querySelector("[data-conversation]"),
    status: section.querySelector("[data-pane-status]"),
    messages: [], // this pane's history: user and assistant turns
  };
}

function bubble(pane, role, text) {
  const element = document.createElement("div");
  element.className = `message ${role}`;
  element.dataset.role = role;
  element.textContent = text;
  pane.conversation.append(element);
  pane.conversation.scrollTop = pane.conversation.scrollHeight;
  return element;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// POST the chat; retried while the model is starting. Returns the streaming response, or throws
// an Error with the message to show.
async function open(url, token, body, pane) {
  const deadline = Date.now() + STARTING_FOR_MS;
  for (;;) {
    const response = await fetch(url, {
      method: "POST",
      credentials: "same-origin",
      redirect: "manual",
      headers: { "Content-Type": "application/json", "X-CSRFToken": token, Accept: "text/event-stream" },
      body: JSON.stringify(body),
    });
    if (response.type === "opaqueredirect" || response.status === 403) {
      throw new Error("You were signed out: reload the page to sign in again.");
    }
    const type = response.headers.get("Content-Type") || "";
    if (response.ok && type.startsWith("text/event-stream")) return response;
    let error = { message: `HTTP ${response.status}` };
    try {
      error = (await response.json()).error || error;
    } catch {
      // not JSON: the status says it
    }
    if (response.status === 503 && error.code === "model_starting" && Date.now() < deadline) {
      pane.status.textContent = "starting…";
      const wait = Number(response.headers.get("Retry-After")) || 2;
      await sleep(Math.min(wait, 5) * 1000);
      continue;
    }
    throw new Error(error.message);
  }
}

// Reads the event stream into `element`, chunk by chunk; resolves with the whole text.
async function stream(response, element, pane) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let text = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    const events = buffer.split("\n\n");
    buffer = events.pop();
    for (const event of events) {
      const data = event.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
      if (!data || data === "[DONE]") continue;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message || "The model stopped answering.");
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (delta && delta.content) {
        text += delta.content;
        element.textContent = text;
        pane.conversation.scrollTop = pane.conversation.scrollHeight;
      }
    }
  }
  return text;
}

async function ask(form, pane, message) {
  const model = pane.model.value.trim();
  if (!model) return;
  const system = form.elements.system.value.trim();
  pane.messages.push({ role: "user", content: message });
  bubble(pane, "user", message);
  const answer = bubble(pane, "assistant", "");
  answer.dataset.streaming = "";
  pane.section.dataset.busy = "";
  pane.status.textContent = "waiting…"; // at once: a cold model's first answer takes seconds
  const body = {
    model,
    messages: (system ? [{ role: "system", content: system }] : []).concat(pane.messages),
    temperature: Number(form.elements.temperature.value),
    max_tokens: Number(form.elements.max_tokens.value),
  };
  try {
    const response = await open(form.dataset.chatUrl, form.elements.csrfmiddlewaretoken.value, body, pane);
    pane.status.textContent = "";
    const text = await stream(response, answer, pane);
    pane.messages.push({ role: "assistant", content: text });
    answer.dataset.done = "";
  } catch (error) {
    pane.messages.pop(); // the question was not answered: it is not part of the conversation
    answer.classList.add("failed");
    answer.dataset.error = "";
    answer.textContent = error.message;
  } finally {
    delete answer.dataset.streaming;
    delete pane.section.dataset.busy;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  const form = document.querySelector("[data-playground]");
  if (!form) return;
  const panes = [...form.querySelectorAll("[data-pane]")].map(paneState);
  const send = form.querySelector("[data-send]");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const message = form.elements.message.value.trim();
    if (!message) return;
    form.elements.message.value = "";
    send.disabled = true;
    try {
      await Promise.all(panes.map((pane) => ask(form, pane, message)));
    } finally {
      send.disabled = false;
      form.elements.message.focus();
    }
  });
  form.querySelector("[data-new-chat]").addEventListener("click", () => {
    for (const pane of panes) {
      pane.messages = [];
      pane.conversation.replaceChildren();
      pane.status.textContent = "";
    }
  });
  for (const pane of panes) {
    // Another model is another conversation.
    pane.model.addEventListener("change", () => { pane.messages = []; pane.conversation.replaceChildren(); });
  }
});

// mlxray's web page: chat with the served models (/v1/chat/completions, streamed) and watch the
// graph work (/mlxray/status). Plain modern JavaScript, no build step, no network but this server.
"use strict";

const $ = (id) => document.getElementById(id);
const KEYS = { chat: "mlxray.chat", settings: "mlxray.settings", apiKey: "mlxray.apiKey",
               model: "mlxray.model" };
const SETTINGS = ["system", "temperature", "top_p", "max_tokens", "seed", "grammar", "json_schema"];

const state = {
  messages: load(KEYS.chat, []),   // {role, content, timings?, error?, stopped?}
  apiKey: localStorage.getItem(KEYS.apiKey) || "",
  controller: null,                // the running request's AbortController
  statusTimer: null,
};

function load(key, fallback) {
  try { return JSON.parse(localStorage.getItem(key)) ?? fallback; } catch { return fallback; }
}
function save(key, value) { localStorage.setItem(key, JSON.stringify(value)); }

// ---- the API: relative paths (the page may sit under an --api-prefix), the key when set ----
async function api(path, options = {}) {
  const headers = { ...(options.headers || {}) };
  if (state.apiKey) headers.Authorization = "Bearer " + state.apiKey;
  const res = await fetch(path, { ...options, headers });
  if (res.status === 401 && (await askKey())) return api(path, options);
  return res;
}

function askKey() {
  const dialog = $("key-dialog");
  $("key-input").value = state.apiKey;
  dialog.showModal();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      const saved = dialog.returnValue === "save";
      if (saved) {
        state.apiKey = $("key-input").value.trim();
        localStorage.setItem(KEYS.apiKey, state.apiKey);
      }
      resolve(saved && state.apiKey !== "");
    }, { once: true });
  });
}

async function errorText(res) {
  try {
    const body = await res.json();
    return body.error?.message || JSON.stringify(body);
  } catch { return `HTTP ${res.status}`; }
}

// ---- models --------------------------------------------------------------------------------
// In router mode (--models-dir, --models-preset) each model has a status: the picker shows it,
// and picking a model that is not loaded loads it (POST /models/load), the label following it.
async function loadModels() {
  const res = await api("v1/models");
  if (!res.ok) return [];
  const { data } = await res.json();
  const select = $("model");
  const wanted = select.value || localStorage.getItem(KEYS.model);
  select.replaceChildren(...data.map((m) => new Option(modelLabel(m), m.id)));
  if (data.some((m) => m.id === wanted)) select.value = wanted;
  return data;
}

function modelLabel(model) {
  const status = model.status?.value;
  return status ? `${model.id} (${status}${model.status.failed ? ", failed" : ""})` : model.id;
}

async function pickModel(name) {
  localStorage.setItem(KEYS.model, name);
  const status = (models) => models.find((m) => m.id === name)?.status;
  const before = status(await loadModels());
  if (!before || before.value !== "unloaded") return;
  const res = await api("models/load", { method: "POST", body: JSON.stringify({ model: name }),
                                         headers: { "Content-Type": "application/json" } });
  if (!res.ok) return;
  for (let i = 0; i < 120; i++) {  // the label follows the load, for a minute at most
    await new Promise((done) => setTimeout(done, 500));
    const now = status(await loadModels());
    if (!now || now.value === "loaded" || (now.value === "unloaded" && now.failed)) return;
  }
}

// ---- settings ------------------------------------------------------------------------------
function restoreSettings() {
  const saved = load(KEYS.settings, {});
  for (const name of SETTINGS) {
    const input = $("set-" + name);
    if (saved[name] !== undefined) input.value = saved[name];
    input.addEventListener("change", () => {
      save(KEYS.settings, Object.fromEntries(SETTINGS.map((n) => [n, $("set-" + n).value])));
    });
  }
}

function requestBody() {
  const value = (name) => $("set-" + name).value.trim();
  const history = state.messages.filter((m) => !m.error)
    .map(({ role, content }) => ({ role, content }));
  const system = value("system");
  const body = {
    model: $("model").value,
    messages: system ? [{ role: "system", content: system }, ...history] : history,
    stream: true,
  };
  for (const name of ["temperature", "top_p"]) if (value(name) !== "") body[name] = Number(value(name));
  for (const name of ["max_tokens", "seed"]) if (value(name) !== "") body[name] = parseInt(value(name), 10);
  if (value("grammar")) body.grammar = value("grammar");
  if (value("json_schema")) {
    body.response_format = { type: "json_schema",
                             json_schema: { schema: JSON.parse(value("json_schema")) } };
  }
  return body;
}

// ---- rendering -----------------------------------------------------------------------------
// Text with ``` fenced code blocks and `inline code`; built from text nodes, never from HTML.
function renderContent(element, text) {
  const parts = text.split("```");
  const nodes = [];
  parts.forEach((part, i) => {
    if (i % 2 === 1) {
      const newline = part.indexOf("\n");
      const code = document.createElement("code");
      code.textContent = newline >= 0 ? part.slice(newline + 1) : part;
      const lang = newline >= 0 ? part.slice(0, newline).trim() : "";
      if (lang) code.dataset.lang = lang;
      const pre = document.createElement("pre");
      pre.append(code);
      nodes.push(pre);
      return;
    }
    part.split("`").forEach((piece, j) => {
      if (j % 2 === 1) {
        const code = document.createElement("code");
        code.textContent = piece;
        nodes.push(code);
      } else if (piece) {
        nodes.push(document.createTextNode(piece));
      }
    });
  });
  element.replaceChildren(...nodes);
}

function timingsText(t) {
  const rate = (x) => (x ? x.toFixed(1) : "0");
  return `prompt ${t.prompt_n} tokens, ${rate(t.prompt_per_second)} tokens/s · ` +
         `generated ${t.predicted_n} tokens, ${rate(t.predicted_per_second)} tokens/s · ` +
         `cache hit ${t.cache_n} tokens`;
}

function messageElement(message) {
  const div = document.createElement("div");
  div.className = `message ${message.role}` + (message.error ? " error" : "");
  const body = document.createElement("div");
  body.className = "content";
  renderContent(body, message.error || message.content);
  div.append(body);
  if (message.timings || message.stopped) {
    const small = document.createElement("small");
    small.className = "timings";
    small.textContent = [message.stopped ? "stopped" : "",
                         message.timings ? timingsText(message.timings) : ""]
      .filter(Boolean).join(" · ");
    div.append(small);
  }
  return div;
}

function renderMessages() {
  const list = $("messages");
  list.replaceChildren(...state.messages.map(messageElement));
  list.scrollTop = list.scrollHeight;
}

function updateLast() {
  const list = $("messages");
  const last = state.messages[state.messages.length - 1];
  list.lastElementChild.replaceWith(messageElement(last));
  list.scrollTop = list.scrollHeight;
}

// ---- chat ----------------------------------------------------------------------------------
async function send(text) {
  state.messages.push({ role: "user", content: text });
  let body;
  try { body = requestBody(); } catch (err) {
    state.messages.push({ role: "assistant", content: "", error: "JSON schema: " + err.message });
    renderMessages();
    return;
  }
  const reply = { role: "assistant", content: "" };
  state.messages.push(reply);
  renderMessages();
  setBusy(true);
  state.controller = new AbortController();
  try {
    const res = await api("v1/chat/completions", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body), signal: state.controller.signal,
    });
    if (!res.ok) reply.error = await errorText(res);
    else await readStream(res, reply);
  } catch (err) {
    if (err.name === "AbortError") reply.stopped = true;
    else reply.error = String(err);
  } finally {
    state.controller = null;
    setBusy(false);
    updateLast();
    save(KEYS.chat, state.messages);
  }
}

async function readStream(res, reply) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of frame.split("\n")) {
        if (line.startsWith("data: ")) onFrame(line.slice(6), reply);
      }
    }
    updateLast();
  }
}

function onFrame(data, reply) {
  if (data === "[DONE]") return;
  const chunk = JSON.parse(data);
  if (chunk.error) { reply.error = chunk.error.message; return; }
  for (const choice of chunk.choices || []) reply.content += choice.delta?.content || "";
  if (chunk.timings) reply.timings = chunk.timings;
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
  document.body.dataset.busy = busy ? "1" : "";
}

// ---- status view ---------------------------------------------------------------------------
async function refreshStatus() {
  const res = await api("mlxray/status");
  if (!res.ok) {
    $("status-note").textContent = await errorText(res);
    return;
  }
  const { models } = await res.json();
  $("status-models").replaceChildren(...models.map(modelCard));
}

function modelCard(model) {
  const card = document.createElement("div");
  card.className = "model-card";
  card.dataset.model = model.name;
  const title = document.createElement("h2");
  title.textContent = model.name;
  const facts = document.createElement("div");
  facts.className = "facts";
  const running = model.replicas.length;
  const states = Object.entries(model.replica_states).map(([k, n]) => `${n} ${k}`).join(", ");
  facts.textContent = `deployment ${model.deployment} (${model.deployment_status}: ${states}) · ` +
    `${running} replica${running === 1 ? "" : "s"} reporting · ` +
    `${model.n_parallel} slots each · queue ${model.replicas.reduce((n, r) => n + r.n_deferred, 0)}`;
  const canvas = document.createElement("canvas");
  canvas.className = "rate";
  card.append(title, facts, canvas, ...model.replicas.map(replicaRow));
  requestAnimationFrame(() => drawRate(canvas, model.tokens_per_second));
  return card;
}

function replicaRow(replica) {
  const row = document.createElement("div");
  row.className = "replica";
  row.dataset.replica = replica.replica;
  const busy = replica.slots.filter((s) => s.is_processing).length;
  row.append(`replica ${replica.replica} (node ${replica.node.slice(0, 8)}, pid ${replica.pid}): ${busy} of ` +
             `${replica.slots.length} slots processing, ${replica.n_deferred} queued, ` +
             `${replica.tokens_predicted_total} tokens generated, ` +
             `${replica.prompt_tokens_cached_total} prompt tokens from the cache`);
  const slots = document.createElement("div");
  slots.className = "slots";
  for (const slot of replica.slots) {
    const div = document.createElement("div");
    div.className = "slot" + (slot.is_processing ? " processing" : "");
    div.dataset.state = slot.is_processing ? "processing" : "idle";
    const decoded = slot.task ? `, ${slot.task.n_decoded} tokens` : "";
    div.textContent = `slot ${slot.id}: ${slot.is_processing ? "processing" : "idle"}${decoded}`;
    slots.append(div);
  }
  row.append(slots);
  return row;
}

// tokens per second over the last minute, as a line
function drawRate(canvas, points) {
  const scale = window.devicePixelRatio || 1;
  canvas.width = canvas.clientWidth * scale;
  canvas.height = canvas.clientHeight * scale;
  const ctx = canvas.getContext("2d");
  ctx.scale(scale, scale);
  const w = canvas.clientWidth, h = canvas.clientHeight, pad = 4;
  const now = points.length ? points[points.length - 1][0] : 0;  // the server's clock
  const top = Math.max(1, ...points.map((p) => p[1]));
  ctx.fillStyle = "#6b6b70";
  ctx.font = "11px system-ui";
  const last = points.length ? points[points.length - 1][1] : 0;
  ctx.fillText(`${last.toFixed(1)} tokens/s now, peak ${top.toFixed(1)} (last 60 s)`, 6, 13);
  ctx.strokeStyle = "#2f6fde";
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  points.forEach(([t, rate], i) => {
    const x = pad + (w - 2 * pad) * (1 - (now - t) / 60);
    const y = h - pad - (h - 20 - pad) * (rate / top);
    if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
  });
  ctx.stroke();
}

function show(view) {
  for (const tab of document.querySelectorAll(".tab")) {
    tab.classList.toggle("active", tab.dataset.view === view);
  }
  $("view-chat").hidden = view !== "chat";
  $("view-status").hidden = view !== "status";
  clearInterval(state.statusTimer);
  if (view === "status") {
    refreshStatus();
    state.statusTimer = setInterval(refreshStatus, 1000);
  }
}

// ---- wiring --------------------------------------------------------------------------------
function main() {
  restoreSettings();
  renderMessages();
  loadModels();
  $("model").addEventListener("change", (e) => pickModel(e.target.value));
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("prompt").value;
    if (!text.trim() || state.controller) return;
    $("prompt").value = "";
    send(text);
  });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) {
      e.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => state.controller?.abort());
  $("new-chat").addEventListener("click", () => {
    state.messages = [];
    save(KEYS.chat, state.messages);
    renderMessages();
  });
  $("settings-toggle").addEventListener("click", () => { $("settings").hidden = !$("settings").hidden; });
  $("key-button").addEventListener("click", () => askKey().then(loadModels));
  for (const tab of document.querySelectorAll(".tab")) {
    tab.addEventListener("click", () => show(tab.dataset.view));
  }
}

main();

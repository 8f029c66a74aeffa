// lorafleet console: the chat playground talks to the public API with a tenant's key; the fleet, registry
// and reports views talk to /console/api with the admin (service) token. Each listener serves the page with
// its own views (body data-views): the public one the chat playground, the internal one the operator's
// views. No dependencies, no build step.
"use strict";

const $ = (sel) => document.querySelector(sel);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return node;
}

// An OpenAI error body ({"error": {message, type, param, code}}) as one line of text.
function errorText(body, status) {
  const e = body && body.error;
  if (!e) return `HTTP ${status}`;
  return `${e.message} (type: ${e.type}${e.code ? ", code: " + e.code : ""}, HTTP ${status})`;
}

function showError(id, text) {
  const box = $(id);
  box.textContent = text || "";
  box.hidden = !text;
}

async function readJson(resp) {
  try { return await resp.json(); } catch { return null; }
}

// Server-sent events over a fetch body: calls onEvent(name, data) per event.
async function readSse(resp, onEvent) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const frame = buffer.slice(0, cut);
      buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
      let name = "message";
      const data = [];
      for (const line of frame.split(/\r?\n/)) {
        if (line.startsWith("event:")) name = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) onEvent(name, data.join("\n"));
    }
  }
}

// ---- tabs -------------------------------------------------------------------------------------------
const VIEWS = (document.body.dataset.views || "chat").split(" ");
for (const tab of document.querySelectorAll(".tab")) if (!VIEWS.includes(tab.dataset.view)) tab.remove();
for (const section of document.querySelectorAll(".view")) {
  if (!VIEWS.includes(section.id.slice("view-".length))) section.remove();
}

function show(view) {
  if (!VIEWS.includes(view)) return;
  for (const tab of document.querySelectorAll(".tab")) tab.classList.toggle("active", tab.dataset.view === view);
  for (const section of document.querySelectorAll(".view")) section.hidden = section.id !== `view-${view}`;
  if (view === "reports") loadReports();
}
for (const tab of document.querySelectorAll(".tab")) tab.addEventListener("click", () => show(tab.dataset.view));

// ---- chat playground --------------------------------------------------------------------------------
const apiKey = () => $("#api-key").value.trim();

async function loadModels() {
  showError("#chat-error", "");
  const resp = await fetch("/v1/models", { headers: { Authorization: `Bearer ${apiKey()}` } });
  const body = await readJson(resp);
  if (!resp.ok) { showError("#chat-error", errorText(body, resp.status)); return; }
  const select = $("#alias");
  select.replaceChildren(...body.data.map((m) => el("option", { value: m.id }, m.id)));
  sessionStorage.setItem("lorafleet.apiKey", apiKey());
}

async function sendChat() {
  showError("#chat-error", "");
  const prompt = $("#prompt").value;
  const model = $("#alias").value;
  const answer = el("div", { class: "answer" });
  const meta = el("div", { class: "meta" }, el("span", {}, "waiting..."));
  const box = el("div", { class: "exchange" }, el("div", { class: "q" }, `${model || "(no alias)"} · ${prompt}`), answer, meta);
  $("#chat-log").prepend(box);
  $("#send").disabled = true;
  const started = performance.now();
  let firstAt = null;
  let chunks = 0;
  let usage = null;
  try {
    const resp = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: { Authorization: `Bearer ${apiKey()}`, "Content-Type": "application/json" },
      body: JSON.stringify({
        model, stream: true, stream_options: { include_usage: true },
        max_tokens: Number($("#max-tokens").value) || 64,
        temperature: Number($("#temperature").value) || 0,
        messages: [{ role: "user", content: prompt }],
      }),
    });
    if (!resp.ok) {
      const text = errorText(await readJson(resp), resp.status);
      showError("#chat-error", text);
      box.remove();
      return;
    }
    const adapter = resp.headers.get("x-adapter-id");
    const tier = resp.headers.get("x-adapter-tier");
    await readSse(resp, (name, data) => {
      if (data === "[DONE]") return;
      const msg = JSON.parse(data);
      if (name === "error" || msg.error) { showError("#chat-error", errorText(msg, resp.status)); return; }
      if (msg.usage) usage = msg.usage;
      for (const choice of msg.choices || []) {
        const text = choice.delta && choice.delta.content;
        if (text) {
          if (firstAt === null) firstAt = performance.now();
          chunks += 1;
          answer.textContent += text;
        }
      }
    });
    const ended = performance.now();
    const tokens = usage ? usage.completion_tokens : chunks;
    const ttft = firstAt === null ? null : (firstAt - started) / 1000;
    const decode = firstAt === null ? 0 : (ended - firstAt) / 1000;
    const rate = tokens > 1 && decode > 0 ? (tokens - 1) / decode : null;
    meta.replaceChildren(
      el("span", {}, "x-adapter-id ", el("b", { class: "adapter-id" }, adapter || "-")),
      el("span", {}, "x-adapter-tier ", el("b", { class: "adapter-tier" }, tier || "-")),
      el("span", {}, "TTFT ", el("b", { class: "ttft" }, ttft === null ? "-" : `${(ttft * 1000).toFixed(0)} ms`)),
      el("span", {}, "tokens/s ", el("b", { class: "tokens-per-s" }, rate === null ? "-" : rate.toFixed(1))),
      el("span", {}, "tokens ", el("b", { class: "tokens" }, String(tokens))),
    );
    box.classList.add("done");
  } catch (err) {
    showError("#chat-error", String(err));
    box.remove();
  } finally {
    $("#send").disabled = false;
  }
}

$("#load-models")?.addEventListener("click", loadModels);
$("#send")?.addEventListener("click", sendChat);
if ($("#api-key")) $("#api-key").value = sessionStorage.getItem("lorafleet.apiKey") || "";

// ---- admin token (fleet, registry, reports) ---------------------------------------------------------
function adminToken() {
  const visible = document.querySelector(".view:not([hidden]) .admin-token");
  const token = (visible ? visible.value : "").trim() || sessionStorage.getItem("lorafleet.adminToken") || "";
  sessionStorage.setItem("lorafleet.adminToken", token);
  for (const input of document.querySelectorAll(".admin-token")) input.value = token;
  return token;
}
for (const input of document.querySelectorAll(".admin-token")) input.value = sessionStorage.getItem("lorafleet.adminToken") || "";
const adminHeaders = () => ({ Authorization: `Bearer ${adminToken()}` });

// ---- fleet view -------------------------------------------------------------------------------------
const tags = (ids) => el("span", {}, ...ids.map((id) => el("span", { class: "tag" }, id)));
const seconds = (s) => (s === null || s === undefined ? "-" : `${(s * 1000).toFixed(0)} ms`);
const pct = (x) => (x === null || x === undefined ? "-" : `${(x * 100).toFixed(0)}%`);

function renderFleet(snap) {
  $("#fleet-table tbody").replaceChildren(...snap.replicas.map((r) => el("tr", { "data-replica": r.replica_id },
    el("td", {}, r.replica_id, el("div", { class: "muted" }, r.url)),
    el("td", { class: `status status-${r.phase}` }, r.phase,
      r.merged_adapter_id ? el("div", { class: "muted" }, r.merged_adapter_id) : ""),
    el("td", {}, tags(r.gpu_adapters), el("div", { class: "muted" }, `${r.gpu_adapters.length}/${r.gpu_slots} slots`)),
    el("td", {}, tags(r.ram_adapters)),
    el("td", {}, tags(r.disk_adapters)),
    el("td", {}, String(r.queue_depth)),
    el("td", {}, String(r.tokens_in_flight)),
    el("td", { class: "gpu-hit-rate" }, pct(r.gpu_hit_rate)),
    el("td", {}, r.loads_per_min.toFixed(1)),
    el("td", {}, r.evictions_per_min.toFixed(1)),
    el("td", {}, `${r.age_s.toFixed(1)} s`),
  )));
  $("#adapter-stats-table tbody").replaceChildren(...snap.adapter_stats.map((a) => el("tr", {},
    el("td", {}, a.adapter_id), el("td", { class: "muted" }, new Date(a.window_start).toLocaleTimeString()),
    el("td", {}, String(a.requests)), el("td", {}, a.tokens_per_s.toFixed(1)), el("td", {}, pct(a.gpu_hit_rate)),
    el("td", {}, seconds(a.p50_ttft_s)), el("td", {}, seconds(a.p95_ttft_s)),
  )));
  $("#alerts").replaceChildren(...(snap.alerts.length ? snap.alerts.map((a) => el("li", { class: a.severity },
    `${new Date(a.occurred_at).toLocaleTimeString()} ${a.severity} ${a.kind} ${a.subject}: ${a.message}`))
    : [el("li", { class: "muted" }, "no alerts")]));
  const ready = snap.replicas.filter((r) => r.phase === "ready" || r.phase === "merged").length;
  $("#fleet-summary").textContent =
    `${snap.replicas.length} replicas, ${ready} serving · fleet GPU hit rate ${pct(snap.gpu_hit_rate)} · ` +
    `updated ${new Date(snap.at).toLocaleTimeString()}`;
}

let fleetAbort = null;
async function connectFleet() {
  if (fleetAbort) fleetAbort.abort();
  fleetAbort = new AbortController();
  showError("#fleet-error", "");
  $("#fleet-status").textContent = "connecting...";
  try {
    const resp = await fetch("/console/api/fleet/stream", { headers: adminHeaders(), signal: fleetAbort.signal });
    if (!resp.ok) {
      showError("#fleet-error", errorText(await readJson(resp), resp.status));
      $("#fleet-status").textContent = "not connected";
      return;
    }
    $("#fleet-status").textContent = "live";
    await readSse(resp, (name, data) => { if (name === "fleet") renderFleet(JSON.parse(data)); });
    $("#fleet-status").textContent = "stream ended";
  } catch (err) {
    if (err.name !== "AbortError") { showError("#fleet-error", String(err)); $("#fleet-status").textContent = "not connected"; }
  }
}
$("#fleet-connect")?.addEventListener("click", connectFleet);

// ---- registry view ----------------------------------------------------------------------------------
async function moveAlias(alias, adapterId) {
  showError("#registry-error", "");
  const resp = await fetch(`/console/api/aliases/${alias}`, {
    method: "PUT",
    headers: { ...adminHeaders(), "Content-Type": "application/json" },
    body: JSON.stringify({ adapter_id: adapterId }),
  });
  if (!resp.ok) { showError("#registry-error", errorText(await readJson(resp), resp.status)); return; }
  await loadRegistry();
}

function renderRegistry(reg) {
  const ready = (tenant) => reg.adapters.filter((a) => a.tenant_id === tenant && a.status === "ready");
  $("#aliases-table tbody").replaceChildren(...reg.aliases.map((a) => {
    const select = el("select", { class: "deploy-target" },
      ...ready(a.tenant_id).filter((v) => v.adapter_id !== a.adapter_id).map((v) => el("option", { value: v.adapter_id }, v.adapter_id)));
    const deploy = el("button", { class: "deploy", onclick: () => moveAlias(a.alias, select.value) }, "Deploy");
    deploy.disabled = select.options.length === 0;
    const rollback = el("button", { class: "rollback secondary", onclick: () => moveAlias(a.alias, a.previous_adapter_id) }, "Rollback");
    rollback.disabled = !a.previous_adapter_id;
    return el("tr", { "data-alias": a.alias },
      el("td", {}, a.alias), el("td", { class: "alias-adapter" }, a.adapter_id,
        a.canary_adapter_id ? el("div", { class: "muted" }, `canary ${a.canary_adapter_id} @ ${pct(a.canary_weight)}`) : ""),
      el("td", { class: "muted" }, a.previous_adapter_id || "-"), el("td", {}, String(a.revision)),
      el("td", {}, select, " ", deploy), el("td", {}, rollback));
  }));
  const stats = Object.fromEntries(reg.tenant_stats.map((s) => [s.tenant_id, s]));
  $("#tenants-table tbody").replaceChildren(...reg.tenants.map((t) => {
    const s = stats[t.tenant_id] || {};
    return el("tr", {}, el("td", {}, t.tenant_id), el("td", {}, String(t.requests_per_s)), el("td", {}, String(t.tokens_per_min)),
      el("td", {}, String(s.requests ?? 0)), el("td", {}, seconds(s.p50_ttft_s)), el("td", {}, seconds(s.p95_ttft_s)),
      el("td", {}, s.tokens_per_s === undefined ? "-" : s.tokens_per_s.toFixed(1)),
      el("td", {}, s.usd_per_million_tokens === undefined || s.usd_per_million_tokens === null ? "-" : `$${s.usd_per_million_tokens.toFixed(3)}`));
  }));
  $("#adapters-table tbody").replaceChildren(...reg.adapters.map((a) => el("tr", {},
    el("td", {}, a.adapter_id), el("td", {}, a.tenant_id), el("td", {}, String(a.version)), el("td", {}, String(a.rank)),
    el("td", { class: `adapter-status-${a.status}` }, a.status),
    el("td", { class: "muted" }, a.reason_code ? `${a.reason_code}: ${a.reason || ""}` : ""))));
}

async function loadRegistry() {
  showError("#registry-error", "");
  const resp = await fetch("/console/api/registry", { headers: adminHeaders() });
  const body = await readJson(resp);
  if (!resp.ok) { showError("#registry-error", errorText(body, resp.status)); return; }
  renderRegistry(body);
}
$("#registry-load")?.addEventListener("click", loadRegistry);

// ---- reports ----------------------------------------------------------------------------------------
async function loadReports() {
  const resp = await fetch("/console/api/reports");
  const body = await readJson(resp);
  const items = resp.ok && body ? body.data : [];
  $("#reports").replaceChildren(...(items.length ? items.map((r) => el("li", {},
    el("a", { href: r.url, target: "_blank" }, r.title), el("span", { class: "muted" }, ` · ${new Date(r.modified).toLocaleString()}`)))
    : [el("li", { class: "muted" }, "no reports yet: run `lorafleet loadtest` or `lorafleet simulate`")]));
}

show(location.hash && VIEWS.includes(location.hash.slice(1)) ? location.hash.slice(1) : VIEWS[0]);

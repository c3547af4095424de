// The toolbus demo console (SPEC K2): catalog, schema-driven invoke form, approval
// cards, "always allow" grants (SPEC A3), questions of mounted MCP servers as forms
// (elicitation, SPEC M3), live job feed, log. Everything server-provided is rendered with textContent.
import { ToolbusClient } from "./toolbus.js";

const $ = (sel, root = document) => root.querySelector(sel);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value == null || value === false) continue;
    if (key === "testid") node.dataset.testid = value;
    else if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key.startsWith("data-")) node.setAttribute(key, value);
    else if (value === true) node.setAttribute(key, "");
    else node.setAttribute(key, value);
  }
  for (const child of children) if (child != null) node.append(child);
  return node;
}

const json = (value) => JSON.stringify(value, null, 2);

const ui = {
  connectForm: $("#connect-form"),
  token: $("#token"),
  profile: $("#profile"),
  confirmCalls: $("#confirm-calls"),
  connect: $("#connect"),
  disconnect: $("#disconnect"),
  state: $("#state"),
  session: $("#session"),
  catalog: $("#catalog"),
  catalogVersion: $("#catalog-version"),
  contextForm: $("#context-form"),
  contextProject: $("#context-project"),
  invokeTool: $("#invoke-tool"),
  invokeDesc: $("#invoke-desc"),
  invokeForm: $("#invoke-form"),
  invokeFields: $("#invoke-fields"),
  invokeButton: $("#invoke-button"),
  invokeError: $("#invoke-error"),
  approvals: $("#approvals"),
  approvalCount: $("#approval-count"),
  elicitations: $("#elicitations"),
  elicitationCount: $("#elicitation-count"),
  grants: $("#grants"),
  grantCount: $("#grant-count"),
  grantsEmpty: $("#grants-empty"),
  jobs: $("#jobs"),
  log: $("#log"),
};

let client = null;
let tools = new Map();
let selected = null;      // tool name
let fieldReaders = [];    // () => [name, value | undefined]

// ------------------------------------------------------------------- log

function log(kind, text, { callId, bad = false } = {}) {
  const stamp = new Date().toLocaleTimeString();
  const item = el("li", { testid: "log-entry", class: bad ? "bad" : null, "data-kind": kind, "data-call-id": callId },
    el("time", { text: stamp }), el("span", { class: "mono", text: `${kind} ` }), el("span", { text }));
  ui.log.prepend(item);
  while (ui.log.children.length > 500) ui.log.lastChild.remove();
}

$("#log-clear").addEventListener("click", () => ui.log.replaceChildren());

function showLastResult(msg) {
  const kind = msg.type === "result" && msg.declined ? "declined" : msg.type;
  $('[data-testid="last-result-tool"]').textContent = msg.tool || "";
  const badge = $('[data-testid="last-result-kind"]');
  badge.textContent = kind;
  badge.className = `badge ${kind}`;
  const body = msg.type === "result" ? msg.result
    : msg.type === "dispatched" ? { job_id: msg.job_id, message: msg.message, promoted: msg.promoted || false }
    : { code: msg.code, message: msg.message, violations: msg.violations, suggestions: msg.suggestions, guidance: msg.guidance };
  $('[data-testid="last-result-json"]').textContent = json(body);
}

// ------------------------------------------------------------------- connection

function renderState(state) {
  ui.state.textContent = state;
  ui.state.className = `state state-${state}`;
  const live = state !== "closed";
  ui.connect.disabled = live;
  ui.confirmCalls.disabled = live; // a hello option: it applies to the next connect
  ui.disconnect.disabled = !live;
  ui.invokeButton.disabled = state !== "open" || !selected;
  $('[data-testid="context-apply"]').disabled = state !== "open";
  for (const button of ui.grants.querySelectorAll("button")) button.disabled = state !== "open";
}

function renderSession() {
  if (!client || !client.welcome) { ui.session.textContent = ""; return; }
  const w = client.welcome;
  ui.session.textContent = `${w.user}@${w.profile} · ${w.session_id.slice(0, 10)}… · seq ${client.lastSeq}`;
}

ui.connectForm.addEventListener("submit", async (event) => {
  event.preventDefault();
  if (client) client.close({ bye: false });
  clearSession();
  client = new ToolbusClient({
    token: ui.token.value,
    profile: ui.profile.value.trim() || undefined,
    confirmToolCalls: ui.confirmCalls.checked,
  });
  wire(client);
  try {
    const welcome = await client.connect();
    log("welcome", `${welcome.user} on profile ${welcome.profile}, session ${welcome.session_id}`);
  } catch (err) {
    log("error", `connect failed: ${err.message}`, { bad: true });
  }
});

ui.disconnect.addEventListener("click", () => {
  if (client) client.close({ bye: true });
});

ui.contextForm.addEventListener("submit", async (event) => {
  event.preventDefault();
  if (!client) return;
  const value = ui.contextProject.value.trim();
  try {
    const context = await client.updateContext({ project_id: value || null });
    log("context", json(context));
  } catch (err) {
    log("error", `context.update: ${err.message}`, { bad: true });
  }
});

function clearSession() {
  tools = new Map();
  selected = null;
  ui.catalog.replaceChildren();
  ui.catalogVersion.textContent = "";
  ui.approvals.replaceChildren();
  updateApprovalCount();
  ui.elicitations.replaceChildren();
  updateElicitationCount();
  renderGrants([]);
  renderForm();
}

function wire(c) {
  c.on("state", ({ state }) => {
    if (c !== client) return;
    renderState(state);
    if (state !== "open") log("state", state);
  });
  c.on("welcome", (w) => {
    if (c !== client) return;
    renderSession();
    if (w.resumed) log("welcome", `resumed session ${w.session_id}`);
    refreshGrants(c); // after every connect, resume or resync
  });
  c.on("message", () => { if (c === client) renderSession(); });
  c.on("resync", async () => {
    if (c !== client) return;
    ui.approvals.replaceChildren();
    updateApprovalCount();
    log("resync", "session was lost; a new one started", { bad: true });
    try {
      for (const job of await c.jobs({ limit: 20 })) renderJobInfo(job);
    } catch (err) {
      log("error", `job.list: ${err.message}`, { bad: true });
    }
  });
  c.on("catalog", (msg) => { if (c === client) renderCatalog(msg); });
  c.on("approval", (msg) => { if (c === client) addApproval(msg); });
  c.on("tool.resolved", (msg) => {
    if (c !== client) return;
    removeApproval(msg.approval_id);
    log("tool.resolved", `${msg.tool}: ${msg.resolution} (${msg.reason}${msg.always ? ", always" : ""})`, { callId: msg.call_id });
    // An "Always allow" answer: the server records the grant as it resolves the approval
    // (confirm.result may come first), so list the grants once tool.resolved is here.
    if (msg.always) refreshGrants(c);
  });
  c.on("elicitation", (msg) => {
    if (c !== client) return;
    log("elicit.request", `${msg.tool}: ${msg.message}`, { callId: msg.call_id });
    addElicitation(msg);
  });
  c.on("elicitation.settled", ({ elicitation_id: id }) => { if (c === client) removeElicitation(id); });
  c.on("tool_start", (msg) => {
    if (c !== client) return;
    log("tool_start", `${msg.tool} ${JSON.stringify(msg.params)}${msg.approval_id ? " (awaiting approval)" : ""}`, { callId: msg.call_id });
  });
  for (const type of ["result", "dispatched", "call.error"]) {
    c.on(type, (msg) => {
      if (c !== client) return;
      showLastResult(msg);
      const text = type === "result" ? `${msg.tool}${msg.declined ? " (declined)" : ""} → ${JSON.stringify(msg.result)}`
        : type === "dispatched" ? `${msg.tool} → job ${msg.job_id}: ${msg.message}`
        : `${msg.tool}: ${msg.code}: ${msg.message}`;
      log(type, text, { callId: msg.call_id, bad: type === "call.error" || msg.declined });
      if (type === "dispatched") jobCard(msg.job_id, msg.tool, msg.call_id, msg.message);
    });
  }
  c.on("job.progress", (msg) => { if (c === client) updateJob(msg); });
  for (const type of ["job.done", "job.failed", "job.cancelled"]) {
    c.on(type, (msg) => {
      if (c !== client) return;
      updateJob(msg);
      log(type, `${msg.tool} ${msg.job_id}: ${msg.summary}`, { callId: msg.call_id, bad: type !== "job.done" });
    });
  }
  c.on("error", (msg) => { if (c === client) log("error", `${msg.code}: ${msg.message}`, { bad: true }); });
  c.on("reconnect", (msg) => { if (c === client) log("reconnect", `${msg.reason}; retry after ${msg.retry_after}s`); });
  // SPEC S6: the console cannot mint a credential; it says when the session will close.
  c.on("auth.expiring", (msg) => { if (c === client) log("auth.expiring", `credential expires in ${Math.round(msg.seconds_left)}s; reconnect with a new token`, { bad: true }); });
  c.on("close", ({ code, reason, willReconnect }) => {
    if (c === client) log("close", `${code}${reason ? ` ${reason}` : ""}${willReconnect ? " (reconnecting)" : ""}`, { bad: !willReconnect && code !== 1000 });
  });
}

// ------------------------------------------------------------------- catalog

function renderCatalog(msg) {
  tools = new Map(msg.tools.map((t) => [t.name, t]));
  ui.catalogVersion.textContent = msg.version.slice(0, 12);
  ui.catalog.replaceChildren(...msg.tools.map((tool) => {
    const tags = [el("span", { class: "tag", text: tool.mode })];
    if (tool.requires_approval) tags.push(el("span", { class: "tag danger", text: "approval" }));
    else if (tool.dangerous) tags.push(el("span", { class: "tag danger", text: "dangerous" }));
    return el("li", { "data-tool": tool.name },
      el("button", { type: "button", testid: `tool-${tool.name}`, title: tool.description, "aria-pressed": String(tool.name === selected),
        onclick: () => selectTool(tool.name) },
      el("span", { class: "mono", text: tool.name }), el("span", {}, ...tags)));
  }));
  log("catalog", `${msg.reason}: ${msg.tools.length} tools`);
  if (selected && !tools.has(selected)) selected = null;
  renderForm();
}

function selectTool(name) {
  selected = name;
  for (const button of ui.catalog.querySelectorAll("button")) {
    button.setAttribute("aria-pressed", String(button.dataset.testid === `tool-${name}`));
  }
  renderForm();
}

// ------------------------------------------------------------------- invoke form

const COMBINATORS = ["oneOf", "anyOf", "allOf", "$ref", "not", "if", "patternProperties", "dependentSchemas"];

function mainType(schema) {
  const t = schema.type;
  if (Array.isArray(t)) return t.find((x) => x !== "null") || "null";
  return t;
}

function fieldKind(schema) {
  if (!schema || typeof schema !== "object") return "json";
  if (Array.isArray(schema.enum) && schema.enum.length) return "enum";
  if (COMBINATORS.some((k) => k in schema)) return "json";
  const t = mainType(schema);
  return ["string", "number", "integer", "boolean"].includes(t) ? t : "json";
}

function renderForm() {
  fieldReaders = [];
  ui.invokeError.textContent = "";
  const tool = selected && tools.get(selected);
  ui.invokeTool.textContent = tool ? tool.name : "";
  ui.invokeDesc.textContent = tool ? tool.description : (client ? "Pick a tool from the catalog." : "Connect, then pick a tool.");
  if (tool && tool.mode === "client") {
    ui.invokeDesc.textContent += " (A client-mode tool runs in the app; the server answers wrong_route.)";
  }
  ui.invokeButton.disabled = !tool || !client || client.state !== "open";
  if (!tool) { ui.invokeFields.replaceChildren(); return; }
  const schema = tool.parameters || {};
  const props = schema.properties;
  const complex = !props || typeof props !== "object" || COMBINATORS.some((k) => k in schema);
  if (complex) {
    const area = el("textarea", { testid: "params-json", name: "params", spellcheck: "false" });
    area.value = "{}";
    fieldReaders.push(() => ["*", JSON.parse(area.value || "{}")]);
    ui.invokeFields.replaceChildren(el("label", { class: "field" },
      el("span", { text: "Parameters (JSON)" }), area, el("small", { text: "The schema is too rich for a form; edit the JSON." })));
    return;
  }
  const required = new Set(schema.required || []);
  const rows = Object.entries(props).map(([name, prop]) => fieldRow(name, prop || {}, required.has(name)));
  if (!rows.length) rows.push(el("p", { class: "muted", text: "No parameters." }));
  ui.invokeFields.replaceChildren(...rows);
}

function fieldRow(name, prop, isRequired) {
  const kind = fieldKind(prop);
  const id = `field-${name}`;
  let input;
  let read;
  if (kind === "enum") {
    input = el("select", { id, name, testid: id });
    if (!isRequired || !("default" in prop)) input.append(el("option", { value: "", text: isRequired ? "— choose —" : "(unset)" }));
    prop.enum.forEach((value, index) => input.append(el("option", { value: String(index), text: JSON.stringify(value).replace(/^"|"$/g, "") })));
    if ("default" in prop) input.value = String(prop.enum.findIndex((v) => JSON.stringify(v) === JSON.stringify(prop.default)));
    read = () => (input.value === "" ? undefined : prop.enum[Number(input.value)]);
  } else if (kind === "boolean") {
    if (isRequired) {
      input = el("input", { id, name, type: "checkbox", testid: id, checked: prop.default === true });
      read = () => input.checked;
    } else {
      input = el("select", { id, name, testid: id },
        el("option", { value: "", text: "(unset)" }), el("option", { value: "true", text: "true" }), el("option", { value: "false", text: "false" }));
      read = () => (input.value === "" ? undefined : input.value === "true");
    }
  } else if (kind === "number" || kind === "integer") {
    input = el("input", { id, name, type: "number", testid: id, step: kind === "integer" ? "1" : "any",
      min: prop.minimum, max: prop.maximum, placeholder: "default" in prop ? `default ${prop.default}` : null });
    read = () => {
      const raw = input.value.trim();
      if (raw === "") return undefined;
      const value = Number(raw);
      if (!Number.isFinite(value)) throw new Error(`${name}: not a number`);
      return value;
    };
  } else if (kind === "string") {
    input = el("input", { id, name, type: "text", testid: id, maxlength: prop.maxLength,
      placeholder: "default" in prop ? `default ${prop.default}` : null });
    read = () => (input.value === "" ? undefined : input.value);
  } else {
    input = el("textarea", { id, name, testid: id, spellcheck: "false", placeholder: `JSON (${mainType(prop) || "any"})` });
    read = () => {
      const raw = input.value.trim();
      if (raw === "") return undefined;
      try { return JSON.parse(raw); } catch { throw new Error(`${name}: not valid JSON`); }
    };
  }
  fieldReaders.push(() => [name, read()]);
  return el("label", { class: "field", for: id, "data-field": name },
    el("span", { text: name }, isRequired ? el("span", { class: "req", testid: `required-${name}`, title: "required", text: "*" }) : null,
      el("span", { class: "muted", text: ` ${kind === "enum" ? "enum" : kind}` })),
    input,
    prop.description ? el("small", { text: prop.description }) : null);
}

ui.invokeForm.addEventListener("submit", (event) => {
  event.preventDefault();
  ui.invokeError.textContent = "";
  if (!client || !selected) return;
  let params = {};
  try {
    for (const reader of fieldReaders) {
      const [name, value] = reader();
      if (name === "*") params = value;
      else if (value !== undefined) params[name] = value;
    }
  } catch (err) {
    ui.invokeError.textContent = err.message;
    return;
  }
  const tool = selected;
  client.invoke(tool, params, { catalogVersion: client.catalog?.version }).catch((err) => {
    log("error", `${tool}: ${err.code}: ${err.message}`, { bad: true });
    ui.invokeError.textContent = err.message;
  });
});

// ------------------------------------------------------------------- approvals

function updateApprovalCount() {
  ui.approvalCount.textContent = String(ui.approvals.children.length);
}

function addApproval(msg) {
  if (ui.approvals.querySelector(`[data-approval-id="${CSS.escape(msg.approval_id)}"]`)) return;
  const expiry = el("span", { class: "muted", testid: "approval-expiry" });
  if (msg.expires_at) {
    expiry.dataset.expiresAt = String(msg.expires_at);
    expiry.title = new Date(msg.expires_at * 1000).toLocaleString();
  }
  const note = el("span", { class: "error-text", testid: "approval-note" });
  const buttons = [];
  const decide = (decision) => async () => {
    buttons.forEach((b) => { b.disabled = true; });
    try {
      const reply = await client.confirm(msg.approval_id, decision);
      if (!reply.accepted) {
        note.textContent = `not accepted: ${reply.reason}`;
        buttons.forEach((b) => { b.disabled = false; });
      }
    } catch (err) {
      note.textContent = err.message;
      buttons.forEach((b) => { b.disabled = false; });
    }
  };
  buttons.push(
    el("button", { type: "button", testid: "approval-allow", onclick: decide("allow"), text: "Allow" }),
    el("button", { type: "button", class: "deny", testid: "approval-deny", onclick: decide("deny"), text: "Deny" }),
    el("button", { type: "button", class: "secondary", testid: "approval-always", onclick: decide("allow_always"), text: "Always allow" }),
  );
  const card = el("div", { class: "card approval", testid: "approval-card", "data-approval-id": msg.approval_id, "data-call-id": msg.call_id },
    el("div", { class: "head" }, el("strong", { class: "mono", testid: "approval-tool", text: msg.tool }), expiry),
    el("pre", { testid: "approval-params", text: json(msg.params) }),
    el("div", { class: "actions" }, ...buttons, note));
  ui.approvals.append(card);
  updateApprovalCount();
  tickExpiry();
}

function removeApproval(approvalId) {
  const card = ui.approvals.querySelector(`[data-approval-id="${CSS.escape(approvalId)}"]`);
  if (card) card.remove();
  updateApprovalCount();
}

function tickExpiry() {
  const now = Date.now() / 1000;
  for (const node of document.querySelectorAll("[data-expires-at]")) {
    const left = Math.max(0, Math.round(Number(node.dataset.expiresAt) - now));
    const h = Math.floor(left / 3600), m = Math.floor((left % 3600) / 60), s = left % 60;
    node.textContent = `expires in ${h ? `${h}h ` : ""}${m}m ${String(s).padStart(2, "0")}s`;
    const question = node.closest(".elicitation");
    if (left === 0 && question && !question.classList.contains("expired")) {
      // The server answered the tool "cancel" at expires_at (SPEC M3).
      question.classList.add("expired");
      for (const button of question.querySelectorAll("button")) button.disabled = true;
      $('[data-testid="elicitation-note"]', question).textContent = "expired: the tool was told cancel";
    }
  }
}
setInterval(tickExpiry, 1000);

// ------------------------------------------------------------------- elicitations

// A mounted MCP server asks the user during a call (SPEC M3). MCP elicitation restricts
// the requested schema to a flat object of primitive properties: string (format email,
// uri, date, date-time; minLength/maxLength), number and integer (minimum/maximum),
// boolean, single-select enums (enum, legacy enumNames, or oneOf/anyOf of const+title)
// and multi-select arrays of such enums. Anything else gets a JSON box.

const STRING_INPUT = { email: "email", uri: "url", date: "date", "date-time": "datetime-local" };

function updateElicitationCount() {
  ui.elicitationCount.textContent = String(ui.elicitations.children.length);
}

function choicesOf(prop) {
  if (!prop || typeof prop !== "object") return null;
  if (Array.isArray(prop.enum)) {
    return prop.enum.map((value, i) => ({ value, label: String(prop.enumNames?.[i] ?? value) }));
  }
  const list = prop.oneOf || prop.anyOf;
  if (Array.isArray(list) && list.length && list.every((o) => o && typeof o === "object" && "const" in o)) {
    return list.map((o) => ({ value: o.const, label: String(o.title ?? o.const) }));
  }
  return null;
}

/** One form row for property `name`: {row, read}; read() returns the typed value, or
 *  undefined when left empty, and throws an Error naming the field when it is invalid. */
function elicitField(questionId, name, prop, isRequired) {
  const id = `elicit-${questionId}-${name}`;
  const testid = `elicit-field-${name}`;
  const label = prop.title || name;
  const t = mainType(prop);
  const choices = t === "array" ? choicesOf(prop.items) : choicesOf(prop);
  let input;
  let read;
  if (t === "array" && choices) {
    const chosen = new Set((Array.isArray(prop.default) ? prop.default : []).map((v) => JSON.stringify(v)));
    const boxes = choices.map((choice) => el("input", { type: "checkbox", checked: chosen.has(JSON.stringify(choice.value)) }));
    input = el("div", { id, class: "choices", testid },
      ...choices.map((choice, i) => el("label", {}, boxes[i], ` ${choice.label}`)));
    read = () => {
      const values = choices.filter((_, i) => boxes[i].checked).map((choice) => choice.value);
      if (!values.length && !isRequired) return undefined;
      if (prop.minItems != null && values.length < prop.minItems) throw new Error(`${label}: choose at least ${prop.minItems}`);
      if (prop.maxItems != null && values.length > prop.maxItems) throw new Error(`${label}: choose at most ${prop.maxItems}`);
      return values;
    };
  } else if (choices) {
    input = el("select", { id, name, testid });
    const hasDefault = "default" in prop;
    if (!hasDefault || !isRequired) input.append(el("option", { value: "", text: isRequired ? "— choose —" : "(unset)" }));
    choices.forEach((choice, i) => input.append(el("option", { value: String(i), text: choice.label })));
    if (hasDefault) input.value = String(choices.findIndex((c) => JSON.stringify(c.value) === JSON.stringify(prop.default)));
    read = () => (input.value === "" ? undefined : choices[Number(input.value)].value);
  } else if (t === "boolean") {
    input = el("input", { id, name, type: "checkbox", testid, checked: prop.default === true });
    read = () => input.checked;
  } else if (t === "number" || t === "integer") {
    input = el("input", { id, name, type: "number", testid, step: t === "integer" ? "1" : "any",
      min: prop.minimum, max: prop.maximum });
    if (typeof prop.default === "number") input.value = String(prop.default);
    read = () => {
      const raw = input.value.trim();
      if (raw === "") return undefined;
      const value = Number(raw);
      if (!Number.isFinite(value)) throw new Error(`${label}: not a number`);
      if (t === "integer" && !Number.isInteger(value)) throw new Error(`${label}: not a whole number`);
      if (prop.minimum != null && value < prop.minimum) throw new Error(`${label}: at least ${prop.minimum}`);
      if (prop.maximum != null && value > prop.maximum) throw new Error(`${label}: at most ${prop.maximum}`);
      return value;
    };
  } else if (t === "string") {
    input = el("input", { id, name, type: STRING_INPUT[prop.format] || "text", testid,
      minlength: prop.minLength, maxlength: prop.maxLength });
    if (typeof prop.default === "string") input.value = prop.default;
    read = () => {
      const raw = input.value;
      if (raw === "") return undefined;
      if (input.validity.typeMismatch || input.validity.badInput) throw new Error(`${label}: not a valid ${prop.format}`);
      if (prop.minLength != null && raw.length < prop.minLength) throw new Error(`${label}: at least ${prop.minLength} characters`);
      if (prop.maxLength != null && raw.length > prop.maxLength) throw new Error(`${label}: at most ${prop.maxLength} characters`);
      return prop.format === "date-time" ? new Date(raw).toISOString() : raw;
    };
  } else {
    input = el("textarea", { id, name, testid, spellcheck: "false", placeholder: "JSON" });
    read = () => {
      const raw = input.value.trim();
      if (raw === "") return undefined;
      try { return JSON.parse(raw); } catch { throw new Error(`${label}: not valid JSON`); }
    };
  }
  const checked = () => {
    const value = read();
    if (value === undefined && isRequired) throw new Error(`${label}: required`);
    return value;
  };
  const group = t === "array" && choices; // a group of checkboxes, each with its own label
  const row = el(group ? "div" : "label", { class: "field", for: group ? null : id, "data-field": name },
    el("span", { text: label }, isRequired ? el("span", { class: "req", testid: `elicit-required-${name}`, title: "required", text: "*" }) : null),
    input,
    prop.description ? el("small", { text: prop.description }) : null);
  return { row, read: checked };
}

function addElicitation(msg) {
  if (ui.elicitations.querySelector(`[data-elicitation-id="${CSS.escape(msg.elicitation_id)}"]`)) return;
  const schema = msg.requested_schema || {};
  const required = new Set(schema.required || []);
  const fields = Object.entries(schema.properties || {}).map(([name, prop]) =>
    [name, elicitField(msg.elicitation_id, name, prop || {}, required.has(name))]);
  const expiry = el("span", { class: "muted", testid: "elicitation-expiry" });
  if (msg.expires_at) {
    expiry.dataset.expiresAt = String(msg.expires_at);
    expiry.title = new Date(msg.expires_at * 1000).toLocaleString();
  }
  const note = el("span", { class: "error-text", testid: "elicitation-note", role: "alert" });
  const buttons = [];
  const answer = (action) => async (event) => {
    event.preventDefault();
    note.textContent = "";
    let content;
    if (action === "accept") {
      content = {};
      try {
        for (const [name, field] of fields) {
          const value = field.read();
          if (value !== undefined) content[name] = value;
        }
      } catch (err) {
        note.textContent = err.message; // nothing is sent: fix the form, or decline
        return;
      }
    }
    buttons.forEach((b) => { b.disabled = true; });
    try {
      const reply = await client.answerElicitation(msg.elicitation_id, action, content);
      log("elicit.answer", `${msg.tool}: ${action}${reply.accepted ? "" : ` (not accepted: ${reply.reason})`}`,
        { callId: msg.call_id, bad: !reply.accepted });
    } catch (err) {
      note.textContent = err.message;
      buttons.forEach((b) => { b.disabled = false; });
    }
  };
  buttons.push(
    el("button", { type: "submit", testid: "elicitation-accept", text: "Send" }),
    el("button", { type: "button", class: "deny", testid: "elicitation-decline", onclick: answer("decline"), text: "Decline" }),
    el("button", { type: "button", class: "secondary", testid: "elicitation-cancel", onclick: answer("cancel"), text: "Cancel" }),
  );
  const form = el("form", { class: "fields", testid: "elicitation-form", novalidate: true, onsubmit: answer("accept") },
    ...fields.map(([, field]) => field.row),
    el("div", { class: "actions" }, ...buttons, note));
  const card = el("div", { class: "card elicitation", testid: "elicitation-card",
    "data-elicitation-id": msg.elicitation_id, "data-call-id": msg.call_id },
  el("div", { class: "head" }, el("strong", { class: "mono", testid: "elicitation-tool", text: msg.tool }), expiry),
  el("p", { testid: "elicitation-message", text: msg.message }),
  form);
  ui.elicitations.append(card);
  updateElicitationCount();
  tickExpiry();
}

function removeElicitation(elicitationId) {
  const card = ui.elicitations.querySelector(`[data-elicitation-id="${CSS.escape(elicitationId)}"]`);
  if (card) card.remove();
  updateElicitationCount();
}

// ------------------------------------------------------------------- grants

let grantsGeneration = 0; // only the latest grants.list answer is rendered

async function refreshGrants(c) {
  const generation = ++grantsGeneration;
  try {
    const granted = await c.grants();
    if (c === client && generation === grantsGeneration) renderGrants(granted);
  } catch (err) {
    if (c === client) log("error", `grants.list: ${err.message}`, { bad: true });
  }
}

function renderGrants(granted) {
  ui.grants.replaceChildren(...granted.map((tool) => {
    const revoke = el("button", { type: "button", class: "small deny", testid: "grant-revoke", text: "Revoke",
      title: `Ask again before every ${tool} call`, disabled: !client || client.state !== "open",
      onclick: async () => {
        const c = client;
        revoke.disabled = true;
        const generation = ++grantsGeneration;
        try {
          const remaining = await c.revokeGrant(tool);
          log("grants.revoke", `${tool}: revoked`);
          if (c === client && generation === grantsGeneration) renderGrants(remaining);
        } catch (err) {
          log("error", `grants.revoke ${tool}: ${err.code}: ${err.message}`, { bad: true });
          if (c === client) refreshGrants(c);
        }
      } });
    return el("li", { testid: "grant-item", "data-tool": tool },
      el("span", { class: "mono", testid: "grant-tool", text: tool }), revoke);
  }));
  ui.grantCount.textContent = String(granted.length);
  ui.grantsEmpty.hidden = granted.length > 0;
}

// ------------------------------------------------------------------- jobs

function jobCard(jobId, tool, callId, message) {
  let card = ui.jobs.querySelector(`[data-job-id="${CSS.escape(jobId)}"]`);
  if (card) return card;
  const cancel = el("button", { type: "button", class: "small", testid: "job-cancel", text: "Cancel",
    onclick: async () => {
      cancel.disabled = true;
      try { await client.cancelJob(jobId); } catch (err) { log("error", `job.cancel: ${err.message}`, { bad: true }); cancel.disabled = false; }
    } });
  card = el("div", { class: "card job running", testid: "job-card", "data-job-id": jobId, "data-call-id": callId },
    el("div", { class: "head" }, el("strong", { class: "mono", testid: "job-tool", text: tool }),
      el("span", { class: "status", testid: "job-status", text: "running" }), cancel),
    el("progress", { testid: "job-progress", max: "1" }),
    el("span", { class: "muted", testid: "job-message", text: message || "" }),
    el("div", { testid: "job-summary" }),
    el("div", { testid: "job-artifacts" }));
  ui.jobs.prepend(card);
  return card;
}

function finishJob(card, state, summary, artifacts, error) {
  card.className = `card job ${state}`;
  $('[data-testid="job-status"]', card).textContent = state;
  $('[data-testid="job-summary"]', card).textContent = summary || "";
  const cancel = $('[data-testid="job-cancel"]', card);
  if (cancel) cancel.remove();
  const progress = $('[data-testid="job-progress"]', card);
  if (state === "done") progress.value = 1;
  if (error) $('[data-testid="job-message"]', card).textContent = `${error.code}: ${error.message}`;
  const list = $('[data-testid="job-artifacts"]', card);
  list.replaceChildren(...(artifacts || []).map((art) => el("details", { testid: "job-artifact" },
    el("summary", { text: art.name || art.url || "artifact" }),
    el("pre", { text: typeof art.content === "string" ? art.content : json(art) }))));
}

function updateJob(msg) {
  const card = jobCard(msg.job_id, msg.tool, msg.call_id);
  if (msg.type === "job.progress") {
    if (card.classList.contains("running")) {
      if (typeof msg.progress === "number") $('[data-testid="job-progress"]', card).value = msg.progress;
      if (msg.message) $('[data-testid="job-message"]', card).textContent = msg.message;
      card.dataset.progress = String(msg.progress ?? "");
    }
    return;
  }
  const state = msg.type.slice("job.".length);
  finishJob(card, state, msg.summary, msg.artifacts, msg.error);
}

function renderJobInfo(job) {
  const card = jobCard(job.job_id, job.tool, job.call_id, job.progress_message);
  if (job.state === "queued" || job.state === "running") {
    if (typeof job.progress === "number") $('[data-testid="job-progress"]', card).value = job.progress;
    return;
  }
  finishJob(card, job.state, job.summary, job.artifacts, job.error);
}

renderState("closed");
renderForm();
// Exposed for debugging in the devtools console and for tests.
window.toolbusConsole = { get client() { return client; } };

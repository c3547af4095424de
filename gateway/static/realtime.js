// toolbus <-> OpenAI Realtime bridge (SPEC V1): one dependency-free ES module, no build step.
//
//   import { ToolbusClient } from "/static/toolbus.js";
//   import { bridgeRealtime } from "/static/realtime.js";
//   const toolbus = new ToolbusClient({ token, profile: "voice" });
//   const events = pc.createDataChannel("oai-events");   // WebRTC, or a WebSocket to the API
//   const bridge = bridgeRealtime(toolbus, events, {
//     clientTools: { show_map: async ({ lat, lon }) => ({ shown: true }) },
//     onApproval: (card) => showCard(card),   // card.allow() / card.deny() / card.allowAlways()
//   });
//   await toolbus.connect();
//
// `transport` is anything with `send(string)` and "message" events whose `data` is one JSON
// text: the WebRTC data channel ("oai-events") and the WebSocket are both that. The bridge
// never sees the OpenAI key: the page opens the transport itself with an ephemeral client
// secret that the app's server minted (docs/voice.md, "The key").
//
// Event names and shapes follow the OpenAI Realtime API reference (GA interface; the
// openai-python types under openai/types/realtime are generated from the same OpenAPI spec,
// and tests/browser/test_realtime_bridge.py validates every event against them):
//   client events sent:  session.update {session: {type: "realtime", tools}}
//                        conversation.item.create {item: function_call_output {call_id, output}
//                                                  | message {role: "system", content: [input_text]}}
//                        response.create {}
//   server events read:  response.created, response.output_item.done (item.type "function_call"),
//                        response.done (response.output[] function_call items), error
// The beta interface differs here only in session.update, whose `session` has no `type`
// (option `api: "beta"`). response.function_call_arguments.done is not used: the reference
// says it is also emitted for interrupted, incomplete or cancelled responses and it carries
// no status, while the item of response.output_item.done says "completed" or "incomplete".
//
// Flow (SPEC V1; docs/voice.md has the full event table):
//   - every catalog version becomes one session.update with the `openai-realtime` export
//     (SPEC C4) of the session's tools, so the model follows every change (SPEC C3);
//   - each completed function_call item runs once (a replayed event is ignored; the toolbus
//     call_id is the model's call_id, SPEC I12/I15), as an `invoke` carrying the catalog
//     version the model was given (SPEC I13), or in the page for `client`-mode tools;
//   - its outcome becomes a function_call_output item; once no call of the turn is still
//     running and no response is in flight, one response.create follows;
//   - a job that ends (job.done / job.failed / job.cancelled) becomes one system message
//     item plus response.create, after any in-flight response, once per job.
//   - after a lost session (resumed: false) its job events are gone: job.list, then job.get
//     with a doubling delay for each job still unfinished, until it ends (SPEC D3, J3).

import { realtimeExport } from "./exportrules.js";

/** Output text of an invoke that failed before the server answered (client side). */
function errorOutput(code, message, extra = {}) {
  return JSON.stringify({ error: code, message, ...extra });
}

/**
 * The `openai-realtime` export of catalog tools (SPEC C4): what catalog/exports.py
 * `to_openai_realtime` gives, built from the wire catalog's ToolInfo list by
 * exportrules.js (a tool OpenAI would refuse is left out rather than breaking the rest).
 * @param {Array<{name: string, description: string, parameters: object}>} tools
 * @returns {Array<{type: "function", name: string, description: string, parameters: object}>}
 */
export function realtimeTools(tools) {
  return realtimeExport(tools).tools;
}

/**
 * The function_call_output text for a call's terminal toolbus message (SPEC V1):
 *   result      -> JSON of `result`; a declined call (SPEC A5) -> the declined text
 *   dispatched  -> the tool's dispatch message (SPEC I9, I14), for the model to say now
 *   call.error  -> JSON {error: code, message, suggestions?, guidance?, violations?, ...}
 * @param {object} reply  a `result`, `dispatched` or `call.error` message
 * @returns {string}
 */
export function outputFor(reply) {
  switch (reply.type) {
    case "result":
      if (reply.declined) return String(reply.result.message ?? "The user declined this tool call.");
      return JSON.stringify(reply.result);
    case "dispatched":
      return reply.message;
    default: {
      const hints = {};
      for (const key of ["suggestions", "guidance", "violations", "reason_code"]) {
        const hint = reply[key];
        if (hint != null && !(Array.isArray(hint) && !hint.length)) hints[key] = hint;
      }
      return errorOutput(reply.code, reply.message, hints);
    }
  }
}

const JOB_ENDINGS = {
  "job.done": "has finished",
  "job.failed": "failed",
  "job.cancelled": "was cancelled",
};

/**
 * The system message that tells the model a job ended (SPEC V1, J4).
 * @param {object} job  a job.done / job.failed / job.cancelled message
 * @returns {string}
 */
export function jobText(job) {
  let text = `The background task ${job.tool} (job ${job.job_id}) ${JOB_ENDINGS[job.type]}: ${job.summary}`;
  if (job.error) text += ` Error ${job.error.code}: ${job.error.message}`;
  if (job.result && Object.keys(job.result).length) text += ` Result: ${JSON.stringify(job.result)}`;
  return `${text} Tell the user now.`;
}

const JOB_STATES = { done: "job.done", failed: "job.failed", cancelled: "job.cancelled" };

/** First delay between two job.get of a job followed after a lost session, in ms; it
 *  doubles up to the client's backoff cap (`maxDelay`), else FOLLOW_MAX_DELAY (SPEC D3). */
const FOLLOW_FIRST_DELAY = 500;
const FOLLOW_MAX_DELAY = 10000;

/**
 * Joins one OpenAI Realtime session to one toolbus session (SPEC V1).
 *
 * Events (an EventTarget; `detail` as said), also through `bridge.on(type, fn)`:
 *   send       every event sent to the model (the object, event_id included)
 *   call       {callId, tool, params}: a model function call starts
 *   output     {callId, tool, output}: its function_call_output text
 *   approval   the card given to `onApproval`
 *   resolved   a `tool.resolved` message of one of the bridge's calls
 *   job        {jobId, tool, text}: a job's end, as told to the model
 *   dropped    [{name, rule, message}]: catalog tools the Realtime export had to leave out
 *   error      {source: "model" | "client_tool", ...}: a model `error` event or a failure
 */
export class RealtimeBridge extends EventTarget {
  /**
   * @param {import("./toolbus.js").ToolbusClient} toolbus  connected or not
   * @param {{send(data: string): void, readyState?: any} & EventTarget} transport
   * @param {object} [options]
   * @param {Object<string, function(object, {callId: string, tool: string}): any>} [options.clientTools]
   *        handlers of `client`-mode tools, run in the page (SPEC I3); their value is the output
   * @param {function(object): void} [options.onApproval]  gets {callId, approvalId, tool,
   *        params, expiresAt, allow(), deny(), allowAlways()} for a call awaiting approval (SPEC A2)
   * @param {function(object): void} [options.onResolved]  gets the `tool.resolved` message
   * @param {"ga"|"beta"} [options.api="ga"]  the Realtime interface of the transport
   * @param {string} [options.eventIdPrefix="toolbus_"]  prefix of the event_id of sent events
   */
  constructor(toolbus, transport, options = {}) {
    super();
    this.toolbus = toolbus;
    this.transport = transport;
    this.clientTools = options.clientTools || {};
    this.onApproval = options.onApproval || null;
    this.onResolved = options.onResolved || null;
    this.api = options.api || "ga";
    this.eventIdPrefix = options.eventIdPrefix ?? "toolbus_";
    /** catalog version last sent in session.update (what the model was given) */
    this.catalogVersion = null;
    this._counter = 0;
    this._seen = new Set();       // call_ids ever started: a replayed event runs nothing
    this._calls = new Map();      // call_id -> {callId, tool, state, jobId, jobEvent, resyncs}
    this._announced = new Set();  // job_ids told to the model
    this._following = new Set();  // job_ids asked with job.get after a lost session
    this._resyncs = 0;            // lost sessions so far (resumed: false)
    this._items = [];             // conversation items waiting for no response in flight
    this._wantResponse = false;
    this._responding = false;     // between response.created and response.done
    this._requested = null;       // event_id of our response.create not yet created
    this._unsent = [];            // events waiting for the transport to open
    this._off = [];
    this._closed = false;
  }

  /** Start listening to both sides; sends session.update when a catalog is known. */
  start() {
    const listen = (target, type, fn) => {
      target.addEventListener(type, fn);
      this._off.push(() => target.removeEventListener(type, fn));
    };
    listen(this.transport, "message", (event) => this._onModelFrame(event.data));
    listen(this.transport, "open", () => this._flushTransport());
    const on = (type, fn) => this._off.push(this.toolbus.on(type, fn));
    on("catalog", (msg) => this._syncTools(msg));
    on("approval", (msg) => this._onApproval(msg));
    on("tool.resolved", (msg) => this._onResolved(msg));
    for (const type of Object.keys(JOB_ENDINGS)) on(type, (msg) => this._onJobEnd(msg));
    on("resync", () => this._resyncJobs());
    if (this.toolbus.catalog) this._syncTools(this.toolbus.catalog);
    return this;
  }

  /** Stop listening; calls already running still settle but send nothing. */
  close() {
    for (const off of this._off.splice(0)) off();
    this._closed = true;
  }

  /** Subscribe to a bridge event; returns an unsubscribe function. */
  on(type, fn) {
    const listener = (event) => fn(event.detail, event);
    this.addEventListener(type, listener);
    return () => this.removeEventListener(type, listener);
  }

  _emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }

  // ---------------------------------------------------------------- to the model

  _transportOpen() {
    const state = this.transport.readyState;
    return state === undefined || state === "open" || state === 1;
  }

  _send(event) {
    const sent = { type: event.type, event_id: `${this.eventIdPrefix}${++this._counter}`, ...event };
    if (this._transportOpen()) this.transport.send(JSON.stringify(sent));
    else this._unsent.push(sent);
    this._emit("send", sent);
    return sent.event_id;
  }

  _flushTransport() {
    for (const event of this._unsent.splice(0)) this.transport.send(JSON.stringify(event));
  }

  /** session.update with the catalog's tools, once per catalog version (SPEC C3, C4). */
  _syncTools(catalog) {
    if (this._closed || catalog.version === this.catalogVersion) return;
    this.catalogVersion = catalog.version;
    const { tools, dropped } = realtimeExport(catalog.tools);
    if (dropped.length) this._emit("dropped", dropped);
    const session = { tools };
    if (this.api !== "beta") session.type = "realtime";
    this._send({ type: "session.update", session });
  }

  /** Send queued items, then response.create when nothing holds it back. A response in
   *  flight holds everything (the reference allows one active response per conversation);
   *  a call still running holds response.create, so parallel calls get one answer. A call
   *  waiting for the user's approval does not: the model may go on talking meanwhile. */
  _pump() {
    if (this._closed || this._responding || this._requested) return;
    for (const item of this._items.splice(0)) this._send({ type: "conversation.item.create", item });
    const running = [...this._calls.values()].some((call) => call.state === "running");
    if (this._wantResponse && !running) {
      this._wantResponse = false;
      this._requested = this._send({ type: "response.create" });
    }
  }

  _addItem(item) {
    this._items.push(item);
    this._wantResponse = true;
    this._pump();
  }

  // ---------------------------------------------------------------- from the model

  _onModelFrame(data) {
    if (this._closed || typeof data !== "string") return;
    let event;
    try {
      event = JSON.parse(data);
    } catch {
      return;
    }
    const handler = event && MODEL_EVENTS[event.type];
    if (handler) handler.call(this, event);
  }

  _functionCall(item) {
    if (!item || item.type !== "function_call") return;
    // An interrupted response leaves its call "incomplete": never run half-formed arguments.
    if (item.status && item.status !== "completed") return;
    if (!item.call_id || this._seen.has(item.call_id)) return;  // a replay (SPEC I15)
    this._seen.add(item.call_id);
    const call = {
      callId: item.call_id,
      tool: item.name,
      state: "running",
      jobId: null,
      jobEvent: null,
      resyncs: this._resyncs,  // lost sessions before it started
    };
    this._calls.set(call.callId, call);
    this._run(call, item.arguments).then(
      (output) => this._answer(call, output),
      (err) => this._answer(call, errorOutput("client", String(err?.message || err))),
    );
  }

  async _run(call, args) {
    let params;
    try {
      params = args ? JSON.parse(args) : {};
    } catch (err) {
      return errorOutput("invalid_arguments", `The arguments are not valid JSON (${err.message}). Call ${call.tool} again with a JSON object.`);
    }
    if (params === null || typeof params !== "object" || Array.isArray(params)) {
      return errorOutput("invalid_arguments", `The arguments must be a JSON object. Call ${call.tool} again with one.`);
    }
    this._emit("call", { callId: call.callId, tool: call.tool, params });
    const info = this.toolbus.catalog?.tools.find((tool) => tool.name === call.tool);
    if (info && info.mode === "client") return this._runClientTool(call, params);
    let reply;
    try {
      reply = await this.toolbus.invoke(call.tool, params, {
        callId: call.callId,
        catalogVersion: this.catalogVersion || undefined,
      });
    } catch (err) {
      return errorOutput(err.code || "client", err.message);
    }
    if (reply.type === "dispatched") {
      call.jobId = reply.job_id;
      // Dispatched after a lost session (a re-sent invoke, SPEC I15): the job's events
      // may go to that session (SPEC J4), so follow it with job.get (SPEC D3).
      if (call.resyncs !== this._resyncs) this._followJob(call.jobId);
    }
    return outputFor(reply);
  }

  /** A `client`-mode tool runs here, in the page (SPEC I3: the server would refuse it). */
  async _runClientTool(call, params) {
    const handler = this.clientTools[call.tool];
    if (typeof handler !== "function") {
      return errorOutput("no_client_handler", `This app cannot run ${call.tool}. Tell the user it is unavailable here.`);
    }
    try {
      const value = await handler(params, { callId: call.callId, tool: call.tool });
      return JSON.stringify(value === undefined ? { ok: true } : value);
    } catch (err) {
      this._emit("error", { source: "client_tool", tool: call.tool, message: String(err?.message || err) });
      return errorOutput("client_error", `${call.tool} failed in the app: ${err?.message || err}`);
    }
  }

  _answer(call, output) {
    call.state = call.jobId ? "dispatched" : "done";
    if (this._closed) return;
    this._emit("output", { callId: call.callId, tool: call.tool, output });
    this._items.push({ type: "function_call_output", call_id: call.callId, output });
    this._wantResponse = true;
    const early = call.jobEvent;
    call.jobEvent = null;
    if (early) this._announceJob(early);  // the job ended before its dispatch was answered
    this._pump();
  }

  // ---------------------------------------------------------------- from toolbus

  _onApproval(msg) {
    const call = this._calls.get(msg.call_id);
    if (!call) return;
    call.state = "approval";
    const decide = (decision) => this.toolbus.confirm(msg.approval_id, decision);
    const card = {
      callId: msg.call_id,
      approvalId: msg.approval_id,
      tool: msg.tool,
      params: msg.params,
      expiresAt: msg.expires_at,
      allow: () => decide("allow"),
      deny: () => decide("deny"),
      allowAlways: () => decide("allow_always"),
    };
    this._emit("approval", card);
    if (this.onApproval) this.onApproval(card);
    this._pump();
  }

  _onResolved(msg) {
    const call = this._calls.get(msg.call_id);
    if (!call) return;
    if (call.state === "approval") call.state = "running";
    this._emit("resolved", msg);
    if (this.onResolved) this.onResolved(msg);
  }

  _onJobEnd(msg) {
    const call = msg.call_id ? this._calls.get(msg.call_id) : null;
    if (!call) return;  // not a job this bridge started
    if (call.state === "running" || call.state === "approval") {
      call.jobEvent = msg;  // told after the dispatch message, in _answer
      return;
    }
    this._announceJob(msg);
  }

  _announceJob(msg) {
    if (this._announced.has(msg.job_id)) return;  // once per job, whatever replays
    this._announced.add(msg.job_id);
    const text = jobText(msg);
    this._emit("job", { jobId: msg.job_id, tool: msg.tool, text });
    this._addItem({ type: "message", role: "system", content: [{ type: "input_text", text }] });
  }

  /** After a lost session (resumed: false) the job events it held are gone (SPEC J4: they
   *  go to the session that created the job): ask the server for the jobs this bridge
   *  started, tell the model about those that ended, and follow each one still unfinished
   *  with job.get until it ends (SPEC V1, D3, J3), as the Python client does. */
  async _resyncJobs() {
    this._resyncs += 1;
    const mine = new Set([...this._calls.values()].map((call) => call.jobId).filter(Boolean));
    for (const jobId of this._announced) mine.delete(jobId);
    if (!mine.size) return;
    let jobs = [];
    try {
      jobs = await this.toolbus.jobs();
    } catch {
      // no listing (the socket dropped again): job.get below asks for each job
    }
    for (const job of jobs) {
      if (mine.has(job.job_id) && this._tellEnded(job)) mine.delete(job.job_id);
    }
    for (const jobId of mine) this._followJob(jobId);
  }

  /** Tell the model about `job` (a JobInfo) if it ended, as for its live job event
   *  (after its call's dispatch output, once); returns whether it ended. */
  _tellEnded(job) {
    const type = JOB_STATES[job.state];
    if (!type) return false;
    const call = job.call_id && this._calls.get(job.call_id);
    const msg = { type, ...job, summary: job.summary || type };
    if (call) this._onJobEnd(msg);
    else this._announceJob(msg);
    return true;
  }

  /** Ask job.get about `jobId` with a doubling delay (FOLLOW_FIRST_DELAY ms up to the
   *  client's backoff cap) until it ends, the model was told of it (a live job event
   *  reached this session), the bridge closed, or the job is not the user's (SPEC J3). A
   *  failed ask (the socket is down) is asked again later. Once per job. */
  async _followJob(jobId) {
    if (this._following.has(jobId)) return;
    this._following.add(jobId);
    const cap = Math.max(this.toolbus.maxDelay || FOLLOW_MAX_DELAY, FOLLOW_FIRST_DELAY);
    let delay = FOLLOW_FIRST_DELAY;
    try {
      while (!this._closed && !this._announced.has(jobId)) {
        await new Promise((resolve) => setTimeout(resolve, delay));
        if (this._closed || this._announced.has(jobId)) return;
        let job = null;
        try {
          job = await this.toolbus.job(jobId);
        } catch (err) {
          if (err?.code === "unknown_job") return;
        }
        if (job && this._tellEnded(job)) return;
        delay = Math.min(delay * 2, cap);
      }
    } finally {
      this._following.delete(jobId);
    }
  }
}

/** Handlers of the server events the bridge reads, by event type. */
const MODEL_EVENTS = {
  "response.created"() {
    this._responding = true;
    this._requested = null;
  },
  "response.output_item.done"(event) {
    this._functionCall(event.item);
  },
  "response.done"(event) {
    // Every call of the response, in case an output_item.done was missed; seen ones are skipped.
    for (const item of event.response?.output || []) this._functionCall(item);
    this._responding = false;
    this._requested = null;
    this._pump();
  },
  error(event) {
    const error = event.error || {};
    if (this._requested && error.event_id === this._requested) {
      // Our response.create was refused: a response is already active (its response.done
      // will pump again), or something else went wrong (do not loop; the next pump retries).
      this._requested = null;
      this._wantResponse = true;
      if (error.code === "conversation_already_has_active_response") this._responding = true;
    }
    this._emit("error", { source: "model", ...error });
  },
};

/**
 * Join an OpenAI Realtime session (its data channel or WebSocket) to a toolbus session
 * (SPEC V1). Returns the started {@link RealtimeBridge}; `bridge.close()` detaches it.
 * @param {import("./toolbus.js").ToolbusClient} toolbus
 * @param {{send(data: string): void} & EventTarget} transport
 * @param {object} [options]  see {@link RealtimeBridge}
 */
export function bridgeRealtime(toolbus, transport, options = {}) {
  return new RealtimeBridge(toolbus, transport, options).start();
}

export default bridgeRealtime;

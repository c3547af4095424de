// toolbus browser client (SPEC K2): one dependency-free ES module, no build step.
//
//   import { ToolbusClient } from "/static/toolbus.js";
//   const client = new ToolbusClient({ url: "ws://127.0.0.1:8765/", token, profile: "demo" });
//   client.addEventListener("job.done", (e) => console.log(e.detail.summary));
//   await client.connect();
//   const reply = await client.invoke("convert_units", { value: 1, from_unit: "mi", to_unit: "km" });
//
// Protocol reference: docs/protocol.md. Usage: docs/browser.md.
//
// Delivery (SPEC D1-D3): every durable server event carries a per-session `seq`. The
// client processes each seq once (duplicates and replays of already processed seqs are
// dropped), acknowledges cumulatively with `ack`, and on an unexpected close reconnects
// with exponential backoff + jitter and resumes with `session_id`, `resume_token` and
// `last_seq` (the highest seq processed). A `reconnect` hint followed by a 1012 close
// (server drain, SPEC S4) is handled the same way, after the hinted delay.

export const PROTOCOL = "toolbus.v1";

/** Server events that carry `seq` (docs/protocol.md, "Durable events"). */
export const DURABLE_TYPES = new Set([
  "catalog", "tool_start", "tool.resolved", "elicit.request", "result", "dispatched", "call.error",
  "job.progress", "job.done", "job.failed", "job.cancelled",
]);

/** Events that end a call for good: its open elicitations can no longer be answered. */
const CALL_END_TYPES = new Set(["result", "call.error", "job.done", "job.failed", "job.cancelled"]);

/** The one terminal reply of each invoke (SPEC I12). */
export const TERMINAL_TYPES = new Set(["result", "dispatched", "call.error"]);

/** Close codes after which reconnecting is pointless or wrong. */
const FATAL_CLOSE = new Map([
  [1008, "policy violation"],
  [4000, "session resumed on another connection"],
  [4001, "session ended"],
  [4003, "authentication failed"],
  [4004, "credential expired"],   // SPEC S6: refresh before expires_at (auth.expiring)
  [4005, "credential revoked"],
]);

/** A client-side failure; `.code` is the wire error code when the server refused, `.detail` the message. */
export class ToolbusError extends Error {
  constructor(message, code = "client", detail = null) {
    super(message);
    this.name = "ToolbusError";
    this.code = code;
    this.detail = detail;
  }
}

function randomId(prefix) {
  const bytes = new Uint8Array(9);
  globalThis.crypto.getRandomValues(bytes);
  return prefix + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

function defaultUrl() {
  const loc = globalThis.location;
  if (!loc || !loc.host) throw new ToolbusError("ToolbusClient needs a url outside a page");
  return `${loc.protocol === "https:" ? "wss:" : "ws:"}//${loc.host}/`;
}

/**
 * A toolbus session over one WebSocket, kept alive across drops.
 *
 * Events (an EventTarget; each is a CustomEvent whose `detail` is the wire message unless
 * said otherwise), also available through `client.on(type, fn)`:
 *   state          detail {state, previous}: connecting | open | reconnecting | closed
 *   welcome        every welcome (detail.resumed tells whether the session was resumed)
 *   resync         a new session replaced a lost one (resumed: false after a drop):
 *                  pending approvals of the old session are gone; call `jobs()` to resync
 *   catalog, tool_start, tool.resolved, result, dispatched, call.error,
 *   job.progress, job.done, job.failed, job.cancelled   durable events, each seq once
 *   approval       a tool_start carrying approval_id (needs confirm())
 *   elicit.request, elicitation   a running tool (a mounted MCP server) asks the user
 *                  (SPEC M3): message, requested_schema (a flat object of primitive
 *                  properties), expires_at; answer with answerElicitation()
 *   elicitation.settled  detail {elicitation_id, call_id, why}: the question left
 *                  pendingElicitations ("answered", "call_ended", "new_session")
 *   reconnect      the server's drain hint
 *   auth.expiring  the credential expires at detail.expires_at (SPEC S6); call
 *                  refreshCredentials(token) before then, or the server closes 4004
 *   error          a wire `error` message, or {code, message} for client-side failures
 *   message        every decoded server message, before dispatch (raw view; may repeat)
 *   close          detail {code, reason, willReconnect}
 */
export class ToolbusClient extends EventTarget {
  /**
   * @param {object} [options]
   * @param {string} [options.url]  ws:// or wss:// URL; default: the page's own host, path /
   * @param {string} [options.token]  credentials, sent in `hello.token` (never in the URL)
   * @param {string} [options.profile]
   * @param {Object<string,string>} [options.context]  session context (e.g. project_id)
   * @param {boolean} [options.confirmToolCalls]  ask approval for every call (SPEC A1)
   * @param {boolean} [options.reconnect=true]  reconnect and resume after unexpected closes
   * @param {number} [options.initialDelay=250]  first backoff delay, ms
   * @param {number} [options.maxDelay=10000]  backoff cap, ms
   * @param {number} [options.factor=2]  backoff multiplier
   * @param {number} [options.jitter=0.5]  fraction of each delay that is randomised
   * @param {number} [options.maxAttempts=Infinity]  consecutive failed attempts before giving up
   * @param {number} [options.ackDelay=20]  ms to batch acks; 0 acks each event at once
   * @param {number} [options.requestTimeout=30000]  ms before a request (not invoke) fails
   * @param {typeof WebSocket} [options.WebSocket]  WebSocket implementation (tests)
   */
  constructor(options = {}) {
    super();
    this.url = options.url || defaultUrl();
    if (/[?&](token|access_token|jwt|auth|authorization|resume_token)=/i.test(this.url)) {
      throw new ToolbusError("credentials must not go in the URL; pass options.token");
    }
    this.token = options.token ?? null;
    this.profile = options.profile || null;
    this.context = { ...(options.context || {}) };
    this.confirmToolCalls = Boolean(options.confirmToolCalls);
    this.autoReconnect = options.reconnect !== false;
    this.initialDelay = options.initialDelay ?? 250;
    this.maxDelay = options.maxDelay ?? 10000;
    this.factor = options.factor ?? 2;
    this.jitter = options.jitter ?? 0.5;
    this.maxAttempts = options.maxAttempts ?? Infinity;
    this.ackDelay = options.ackDelay ?? 20;
    this.requestTimeout = options.requestTimeout ?? 30000;
    this.WebSocketImpl = options.WebSocket || globalThis.WebSocket;

    /** @type {WebSocket|null} the current socket (exposed for tests and debugging) */
    this.ws = null;
    this.state = "closed";
    this.sessionId = null;
    this.resumeToken = null;
    /** highest durable seq processed in this session */
    this.lastSeq = 0;
    this.ackedSeq = 0;
    this.welcome = null;
    /** latest catalog event: {version, tools, reason, seq} */
    this.catalog = null;
    /** approval_id -> tool_start message, until tool.resolved */
    this.pendingApprovals = new Map();
    /** elicitation_id -> elicit.request, until answered or its call ends (SPEC M3) */
    this.pendingElicitations = new Map();

    this._calls = new Map();      // call_id -> {resolve, reject, frame, sent}
    this._requests = new Map();   // request id -> {resolve, reject, timer, expect, sent}
    this._outbox = [];            // frames waiting for an open session
    this._attempt = 0;
    this._timer = null;
    this._ackTimer = null;
    this._wanted = false;         // the user wants a connection
    this._open = false;           // welcome received on the current socket
    this._retryAfter = null;      // ms, from a `reconnect` hint
    this._replayTarget = null;    // welcome.last_seq of a resume, until replay is processed
    this._connectWaiters = [];
    this._lastError = null;
    /** the last `auth.expiring` of the current credential, null after a refresh (SPEC S6) */
    this.authExpiring = null;
  }

  // ---------------------------------------------------------------- events

  /** Subscribe to an event; `fn` gets the event's detail. Returns an unsubscribe function. */
  on(type, fn) {
    const listener = (event) => fn(event.detail, event);
    this.addEventListener(type, listener);
    return () => this.removeEventListener(type, listener);
  }

  _emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }

  _setState(state) {
    if (state === this.state) return;
    const previous = this.state;
    this.state = state;
    this._emit("state", { state, previous });
  }

  // ---------------------------------------------------------------- lifecycle

  /** Open the session. Resolves with the first `welcome`; rejects on a fatal close. */
  connect() {
    this._wanted = true;
    const done = new Promise((resolve, reject) => this._connectWaiters.push({ resolve, reject }));
    if (this.state === "open" && this.welcome) {
      this._settleConnect(null, this.welcome);
    } else if (!this.ws && !this._timer) {
      this._attempt = 0;
      this._dial("connecting");
    }
    return done;
  }

  /** Close for good. With `bye: true` (default) the server ends the session (no resume). */
  close({ bye = true } = {}) {
    this._wanted = false;
    clearTimeout(this._timer);
    this._timer = null;
    this._flushAck();
    const ws = this.ws;
    if (ws && ws.readyState === 1 && bye && this._open) {
      this._rawSend({ type: "bye", id: randomId("bye-") });
    }
    if (ws) {
      try { ws.close(1000, "client closed"); } catch { /* already closing */ }
    }
    this._detach();
    this._failAll(new ToolbusError("client closed", "closed"), true);
    this._settleConnect(new ToolbusError("client closed", "closed"));
    this._setState("closed");
  }

  /** Test hook: drop the socket as a network failure would (no close handshake semantics). */
  simulateDrop() {
    if (this.ws) this.ws.close(4999, "simulated drop");
  }

  _dial(state) {
    this._timer = null;
    this._setState(state);
    let ws;
    try {
      ws = new this.WebSocketImpl(this.url, PROTOCOL);
    } catch (err) {
      this._lastError = new ToolbusError(String(err && err.message || err), "connect_failed");
      this._afterClose(1006, "constructor failed");
      return;
    }
    this.ws = ws;
    this._open = false;
    ws.onopen = () => {
      if (ws !== this.ws) return;
      const hello = { type: "hello", id: randomId("hello-") };
      if (this.token != null) hello.token = this.token;
      if (this.profile) hello.profile = this.profile;
      if (Object.keys(this.context).length) hello.context = { ...this.context };
      if (this.confirmToolCalls) hello.options = { confirm_tool_calls: true };
      if (this.sessionId && this.resumeToken) {
        hello.session_id = this.sessionId;
        hello.resume_token = this.resumeToken;
        hello.last_seq = this.lastSeq;
      }
      ws.send(JSON.stringify(hello));
    };
    ws.onmessage = (event) => {
      if (ws !== this.ws) return;
      if (typeof event.data !== "string") return;
      this._handleFrame(event.data);
    };
    ws.onerror = () => { /* the close event follows and carries the code */ };
    ws.onclose = (event) => {
      if (ws !== this.ws) return;
      this._detach();
      this._afterClose(event.code, event.reason);
    };
  }

  _detach() {
    const ws = this.ws;
    if (ws) ws.onopen = ws.onmessage = ws.onerror = ws.onclose = null;
    this.ws = null;
    this._open = false;
    this._replayTarget = null;
    clearTimeout(this._ackTimer);
    this._ackTimer = null;
  }

  _afterClose(code, reason) {
    // Requests already on the wire lose their (non-durable) replies: fail them.
    this._failAll(new ToolbusError(`connection closed (${code})`, "connection_lost"), false);
    const fatal = FATAL_CLOSE.get(code);
    this._attempt += 1;
    const willReconnect = this._wanted && this.autoReconnect && !fatal && this._attempt <= this.maxAttempts;
    this._emit("close", { code, reason, willReconnect });
    if (!willReconnect) {
      this._wanted = false;
      const message = this._lastError?.message || reason || fatal || `connection closed (${code})`;
      const error = new ToolbusError(message, this._lastError?.code || `close_${code}`);
      this._failAll(error, true);
      this._settleConnect(error);
      this._setState("closed");
      return;
    }
    const delay = this._nextDelay();
    this._setState("reconnecting");
    this._timer = setTimeout(() => this._dial("reconnecting"), delay);
  }

  _nextDelay() {
    if (this._retryAfter != null) {
      const hinted = this._retryAfter;
      this._retryAfter = null;
      return hinted + Math.random() * Math.min(1000, hinted * this.jitter + 50);
    }
    const base = Math.min(this.maxDelay, this.initialDelay * this.factor ** Math.max(0, this._attempt - 1));
    return base * (1 - this.jitter) + Math.random() * base * this.jitter;
  }

  _settleConnect(error, welcome) {
    const waiters = this._connectWaiters;
    this._connectWaiters = [];
    for (const w of waiters) (error ? w.reject(error) : w.resolve(welcome));
  }

  // ---------------------------------------------------------------- inbound

  /** Decode and process one text frame (exposed for tests: a replayed frame is ignored). */
  _handleFrame(text) {
    let msg;
    try {
      msg = JSON.parse(text);
    } catch {
      this._emit("error", { type: "error", code: "client_decode", message: "undecodable frame from server" });
      return;
    }
    if (!msg || typeof msg !== "object" || typeof msg.type !== "string") return;
    this._emit("message", msg);
    if (typeof msg.seq === "number" && DURABLE_TYPES.has(msg.type)) {
      this._durable(msg);
    } else {
      this._reply(msg);
    }
  }

  _durable(msg) {
    if (msg.seq <= this.lastSeq) {
      this._scheduleAck(); // already processed: a replay or duplicate; re-confirm the ack
      return;
    }
    this.lastSeq = msg.seq;
    switch (msg.type) {
      case "catalog":
        this.catalog = { version: msg.version, tools: msg.tools, reason: msg.reason, seq: msg.seq };
        break;
      case "tool_start":
        if (msg.approval_id) this.pendingApprovals.set(msg.approval_id, msg);
        break;
      case "tool.resolved":
        this.pendingApprovals.delete(msg.approval_id);
        break;
      case "elicit.request":
        this.pendingElicitations.set(msg.elicitation_id, msg);
        break;
      default:
        break;
    }
    if (msg.id && this._requests.has(msg.id)) this._resolveRequest(msg.id, msg);
    try {
      this._emit(msg.type, msg);
      if (msg.type === "tool_start" && msg.approval_id) this._emit("approval", msg);
      if (msg.type === "elicit.request") this._emit("elicitation", msg);
      if (CALL_END_TYPES.has(msg.type)) this._settleElicitations((q) => q.call_id === msg.call_id, "call_ended");
    } finally {
      if (TERMINAL_TYPES.has(msg.type)) {
        const call = this._calls.get(msg.call_id);
        if (call) {
          this._calls.delete(msg.call_id);
          call.resolve(msg);
        }
      }
      this._scheduleAck();
      if (this._replayTarget != null && this.lastSeq >= this._replayTarget) this._afterReplay();
    }
  }

  _reply(msg) {
    switch (msg.type) {
      case "welcome":
        this._onWelcome(msg);
        return;
      case "reconnect":
        this._retryAfter = Math.max(0, Number(msg.retry_after) || 0) * 1000;
        this._emit("reconnect", msg);
        return;
      case "auth.expiring":
        this.authExpiring = msg;
        this._emit(msg.type, msg);
        return;
      case "error":
        if (!this._open) this._lastError = new ToolbusError(msg.message, msg.code, msg);
        if (msg.id && this._calls.size) {
          // An invoke refused before it became a call (rate limit, in-flight cap, ...).
          for (const [callId, call] of this._calls) {
            if (call.frame.id !== msg.id) continue;
            if (msg.code === "duplicate_call" && call.resent) return; // still running: wait
            this._calls.delete(callId);
            call.reject(new ToolbusError(msg.message, msg.code, msg));
            this._emit("error", msg);
            return;
          }
        }
        if (msg.id && this._requests.has(msg.id)) {
          this._rejectRequest(msg.id, new ToolbusError(msg.message, msg.code, msg));
        }
        this._emit("error", msg);
        return;
      default:
        if (msg.id && this._requests.has(msg.id)) this._resolveRequest(msg.id, msg);
        this._emit(msg.type, msg);
    }
  }

  _onWelcome(msg) {
    const previous = this.sessionId;
    if (!msg.resumed) {
      // A new session: seqs start again at 1; the old session's state is gone.
      this.lastSeq = 0;
      this.ackedSeq = 0;
      this.pendingApprovals.clear();
      this._settleElicitations(() => true, "new_session");
    } else {
      this.ackedSeq = 0; // re-send the cumulative ack: the last one may have been lost
    }
    this.welcome = msg;
    this.sessionId = msg.session_id;
    this.resumeToken = msg.resume_token;
    this._open = true;
    this._attempt = 0;
    this._lastError = null;
    this._setState("open");
    this._emit("welcome", msg);
    if (!msg.resumed && previous) {
      // The lost session's calls are not lost: a call_id is a key of the user, not of
      // the session (SPEC I15). _afterReplay re-sends each with the same call_id; the
      // server attaches it to the running call or answers its recorded outcome, and
      // never runs it twice.
      this._emit("resync", { previousSessionId: previous, sessionId: msg.session_id });
    }
    this._settleConnect(null, msg);
    if (msg.resumed && msg.last_seq > this.lastSeq) {
      this._replayTarget = msg.last_seq; // resend unanswered invokes once the replay is in
    } else {
      this._afterReplay();
    }
  }

  _afterReplay() {
    this._replayTarget = null;
    // Invokes sent on a lost socket without a terminal reply: re-send with the same
    // call_id; the server runs each call_id once (SPEC I12).
    for (const call of this._calls.values()) {
      if (call.sent) {
        call.resent = true;
        this._rawSend(call.frame);
      }
    }
    const queued = this._outbox;
    this._outbox = [];
    for (const item of queued) this._transmit(item);
    this._flushAck();
  }

  // ---------------------------------------------------------------- acks

  _scheduleAck() {
    if (this.ackDelay <= 0) return this._flushAck();
    if (this._ackTimer) return;
    this._ackTimer = setTimeout(() => {
      this._ackTimer = null;
      this._flushAck();
    }, this.ackDelay);
  }

  _flushAck() {
    clearTimeout(this._ackTimer);
    this._ackTimer = null;
    if (this.lastSeq > this.ackedSeq && this._open && this._rawSend({ type: "ack", seq: this.lastSeq })) {
      this.ackedSeq = this.lastSeq;
    }
  }

  // ---------------------------------------------------------------- outbound

  _rawSend(frame) {
    const ws = this.ws;
    if (!ws || ws.readyState !== 1) return false;
    ws.send(JSON.stringify(frame));
    return true;
  }

  /** Send now when the session is open, else queue until it is. */
  _transmit(item) {
    if (this._open && this._replayTarget == null && this._rawSend(item.frame)) {
      item.sent = true;
      return;
    }
    this._outbox.push(item);
  }

  _request(frame, { timeout = this.requestTimeout } = {}) {
    if (!this._wanted) return Promise.reject(new ToolbusError("not connected; call connect() first", "closed"));
    frame.id = frame.id || randomId("r-");
    return new Promise((resolve, reject) => {
      const entry = { resolve, reject, frame, sent: false, timer: null };
      if (timeout > 0) {
        entry.timer = setTimeout(() => this._rejectRequest(frame.id, new ToolbusError(`${frame.type} timed out`, "timeout")), timeout);
      }
      this._requests.set(frame.id, entry);
      this._transmit(entry);
    });
  }

  _resolveRequest(id, msg) {
    const entry = this._requests.get(id);
    if (!entry) return;
    this._requests.delete(id);
    clearTimeout(entry.timer);
    entry.resolve(msg);
  }

  _rejectRequest(id, error) {
    const entry = this._requests.get(id);
    if (!entry) return;
    this._requests.delete(id);
    this._outbox = this._outbox.filter((item) => item !== entry);
    clearTimeout(entry.timer);
    entry.reject(error);
  }

  /** Fail requests already sent (their replies are lost); with `everything`, also queued
   *  requests and every pending invoke. */
  _failAll(error, everything) {
    for (const [id, entry] of this._requests) {
      if (everything || entry.sent) this._rejectRequest(id, error);
    }
    if (everything) {
      for (const [callId, call] of this._calls) {
        this._calls.delete(callId);
        call.reject(error);
      }
      this._outbox = [];
    }
  }

  // ---------------------------------------------------------------- API

  /**
   * Call a tool. Resolves with its terminal message: `result` (sync; `declined` true when
   * the user denied it), `dispatched` (async: watch job.* events for `job_id`) or
   * `call.error`. Rejects only when the call cannot get a terminal message (refused
   * request, lost session, client closed).
   * @param {string} tool
   * @param {object} [params]
   * @param {{callId?: string, catalogVersion?: string}} [options]
   */
  invoke(tool, params = {}, { callId, catalogVersion } = {}) {
    if (!this._wanted) return Promise.reject(new ToolbusError("not connected; call connect() first", "closed"));
    const call_id = callId || randomId("call-");
    if (this._calls.has(call_id)) return Promise.reject(new ToolbusError(`call ${call_id} is pending`, "duplicate_call"));
    const frame = { type: "invoke", id: randomId("r-"), call_id, tool, params: params ?? {} };
    if (catalogVersion) frame.catalog_version = catalogVersion;
    return new Promise((resolve, reject) => {
      const call = { resolve, reject, frame, sent: false, resent: false };
      this._calls.set(call_id, call);
      this._transmit(call);
    });
  }

  /** Answer an approval: decision is "allow", "deny" or "allow_always". Resolves with
   *  `confirm.result` ({accepted, reason?}). */
  confirm(approvalId, decision) {
    return this._request({ type: "tool.confirm", approval_id: approvalId, decision });
  }

  /**
   * Answer an `elicit.request` (SPEC M3): action "accept" with `content` (an object
   * matching its requested_schema, typed: numbers as numbers, booleans as booleans),
   * "decline" or "cancel". Resolves with `elicit.result` ({accepted, reason?}); the
   * first answer wins, a later one is not accepted ("unknown").
   */
  async answerElicitation(elicitationId, action, content) {
    const frame = { type: "elicit.answer", elicitation_id: elicitationId, action };
    if (action === "accept" && content !== undefined) frame.content = content;
    const reply = await this._request(frame);
    this._settleElicitations((q) => q.elicitation_id === elicitationId, "answered");
    return reply;
  }

  _settleElicitations(which, why) {
    for (const [id, question] of this.pendingElicitations) {
      if (!which(question)) continue;
      this.pendingElicitations.delete(id);
      this._emit("elicitation.settled", { elicitation_id: id, call_id: question.call_id, why });
    }
  }

  /** Cancel a running or approval-pending call; its terminal message settles invoke(). */
  cancel(callId) {
    const item = { frame: { type: "call.cancel", call_id: callId }, sent: false };
    this._transmit(item);
  }

  /** List this user's jobs (newest first). Resolves with the array of JobInfo. */
  async jobs({ status, limit } = {}) {
    const frame = { type: "job.list" };
    if (status) frame.status = status;
    if (limit) frame.limit = limit;
    return (await this._request(frame)).jobs;
  }

  /** One job's JobInfo. */
  async job(jobId) {
    return (await this._request({ type: "job.get", job_id: jobId })).job;
  }

  /** Cancel a job; resolves with its JobInfo (the job.cancelled event follows). */
  async cancelJob(jobId) {
    return (await this._request({ type: "job.cancel", job_id: jobId })).job;
  }

  /** Change the session context (null removes a key). Resolves with the whole new
   *  context; a `catalog` event (reason "context") follows. */
  async updateContext(context) {
    const reply = await this._request({ type: "context.update", context });
    this.context = { ...reply.context };
    return reply.context;
  }

  /** Ask for the catalog; resolves with `catalog` or `catalog.not_modified`. */
  getCatalog(version = this.catalog?.version) {
    const frame = { type: "catalog.get" };
    if (version) frame.version = version;
    return this._request(frame);
  }

  /** This session's "always allow" tools. */
  async grants() {
    return (await this._request({ type: "grants.list" })).tools;
  }

  /** Revoke an "always allow" grant. */
  async revokeGrant(tool) {
    return (await this._request({ type: "grants.revoke", tool })).tools;
  }

  /** Replace the session's credential on the open socket (SPEC S6). Resolves with the
   *  new expiry (Unix s, or null); the token is also what a reconnect sends from now on.
   *  Rejects with a ToolbusError whose code is auth_failed, principal_mismatch or
   *  profile_denied, and the old credential stands. */
  async refreshCredentials(token) {
    const reply = await this._request({ type: "auth.refresh", token });
    this.token = token;
    this.authExpiring = null;
    return reply.expires_at ?? null;
  }
}

export default ToolbusClient;

// Evaluated in the page by test_realtime_bridge.py (page.evaluate): joins a scripted
// OpenAI Realtime peer (a data-channel-like object: send() + "message" events) to a real
// toolbus session through gateway/static/realtime.js, and exposes `window.rt` for the test.
// No network: the "model" is this object; the toolbus server is the test's real gateway.
(async ({ url, profile, bridgeOptions, channelState, realtimeUrl }) => {
  const { ToolbusClient } = await import("/static/toolbus.js");
  const { bridgeRealtime, realtimeTools } = await import("/static/realtime.js");

  /** Waiters on a growing list: `take(list, n)` resolves with its first n entries, removed. */
  function queue() {
    const q = { items: [], waiters: [] };
    q.push = (item) => {
      q.items.push(item);
      for (const w of q.waiters.splice(0)) w();
    };
    q.take = (n, what, ms = 8000) => new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`timed out waiting for ${n} ${what}; have ${JSON.stringify(q.items)}`)), ms);
      const check = () => {
        if (q.items.length >= n) {
          clearTimeout(timer);
          resolve(q.items.splice(0, n));
        } else {
          q.waiters.push(check);
        }
      };
      check();
    });
    return q;
  }

  /** The scripted Realtime peer: what the bridge sends is recorded; `play` delivers an event. */
  class ScriptedPeer extends EventTarget {
    constructor(state) {
      super();
      this.readyState = state;
      this.sent = queue();
    }
    send(data) {
      if (this.readyState !== "open") throw new Error("send() on a channel that is not open");
      if (typeof data !== "string") throw new Error("send() with a non-string frame");
      this.sent.push(JSON.parse(data));
    }
    open() {
      this.readyState = "open";
      this.dispatchEvent(new Event("open"));
    }
    play(event) {
      this.dispatchEvent(new MessageEvent("message", { data: JSON.stringify(event) }));
    }
  }

  // The toolbus socket, wrapped so a test can hold server frames (from the first of a
  // given type on, order kept) and release them at a chosen moment: "a job ends while the
  // model is speaking" without any timing assumption.
  const gate = { types: new Set(), holding: false, held: [], seen: queue() };
  class GatedWebSocket extends WebSocket {
    get onmessage() { return super.onmessage; }
    set onmessage(fn) {
      super.onmessage = fn && ((event) => {
        const type = typeof event.data === "string" ? JSON.parse(event.data).type : null;
        if (!gate.holding && gate.types.has(type)) gate.holding = true;
        if (!gate.holding) return fn(event);
        gate.held.push(() => fn(event));
        gate.seen.push(type);
      });
    }
  }

  const frames = queue();    // toolbus frames the page sends (acks left out)
  const origSend = WebSocket.prototype.send;
  WebSocket.prototype.send = function (data) {
    if (this.url === url) {  // the toolbus socket, not a Realtime one
      const frame = JSON.parse(data);
      if (frame.type !== "ack") frames.push(frame);
    }
    return origSend.call(this, data);
  };

  const client = new ToolbusClient({
    url, token: "alice-token", profile, initialDelay: 50, jitter: 0, ackDelay: 0, WebSocket: GatedWebSocket,
  });
  // The Realtime transport: the scripted peer in the page, or a real WebSocket to the
  // test's local Realtime stand-in.
  const channel = realtimeUrl ? new WebSocket(realtimeUrl) : new ScriptedPeer(channelState);
  const cards = queue();
  const resolved = queue();
  const mapCalls = [];
  const clientTools = {
    show_map: async (params, meta) => {
      mapCalls.push({ params, meta });
      if (params.zoom === 20) throw new Error("no screen at that zoom");
      return { shown: true, lat: params.lat, lon: params.lon };
    },
  };
  const bridge = bridgeRealtime(client, channel, {
    clientTools,
    eventIdPrefix: "evt_",
    onApproval: (card) => cards.push(card),
    onResolved: (msg) => resolved.push(msg),
    ...bridgeOptions,
  });
  const toolbusEvents = queue();
  for (const type of ["welcome", "resync", "job.done", "job.failed", "result", "dispatched", "call.error"]) {
    client.on(type, (msg) => toolbusEvents.push({ type, msg }));
  }
  const firstCatalog = new Promise((resolve) => { const off = client.on("catalog", () => { off(); resolve(); }); });
  const welcome = await client.connect();
  await firstCatalog;
  const [hello] = await frames.take(1, "hello");
  if (hello.type !== "hello") throw new Error(`first frame is ${hello.type}, not hello`);
  toolbusEvents.items.length = 0;  // the first welcome

  window.rt = {
    client, bridge, channel, frames, cards, resolved, mapCalls, toolbusEvents, realtimeTools,
    play: (events) => { for (const event of events) channel.play(event); },
    /** Next n events the bridge sent to the model. */
    sent: (n) => channel.sent.take(n, "model events"),
    unsent: () => channel.sent.items.slice(),
    /** Next n toolbus frames (acks left out). */
    frames: (n) => frames.take(n, "toolbus frames"),
    unframed: () => frames.items.slice(),
    card: async () => {
      const [card] = await cards.take(1, "approval cards");
      rt.lastCard = card;
      return { callId: card.callId, tool: card.tool, params: card.params, approvalId: card.approvalId, expiresAt: card.expiresAt };
    },
    /** Wait for a toolbus event of `type` (in arrival order, earlier ones of other types dropped). */
    toolbus: async (type) => {
      for (;;) {
        const [event] = await toolbusEvents.take(1, `toolbus ${type}`);
        if (event.type === type) return event.msg;
      }
    },
    /** Hold toolbus server frames from the next one of these types on. */
    hold: (types) => { for (const type of types) gate.types.add(type); },
    /** Wait until a frame of `type` is held. */
    held: async (type) => {
      for (;;) {
        const [seen] = await gate.seen.take(1, `held ${type}`);
        if (seen === type) return;
      }
    },
    /** Deliver every held frame, in order, now; stop holding. */
    release: () => {
      gate.types.clear();
      gate.holding = false;
      for (const deliver of gate.held.splice(0)) deliver();
    },
    /** Resolves at the toolbus client's next `close` event. */
    closed: () => new Promise((resolve) => { const off = client.on("close", (detail) => { off(); resolve(detail); }); }),
    restore: () => { WebSocket.prototype.send = origSend; },
  };
  return { session_id: welcome.session_id, version: client.catalog.version, tools: client.catalog.tools };
})

// The worked voice example (SPEC V3): OpenAI Realtime over WebRTC, its tools from toolbus
// through the bridge in realtime.js. Served by `toolbus serve` at /voice; docs/voice.md.
//
// The key: the page never sees your OpenAI API key. You mint a short-lived client secret
// with it on your own machine or server (examples/voice/mint_key.py calls
// POST /v1/realtime/client_secrets) and paste that `ek_…` value here. The page sends it
// only in the Authorization header of the SDP exchange with OpenAI (POST
// /v1/realtime/calls), keeps it in a local variable for that one request, clears the
// field, and never logs it or sends it to toolbus.

import { ToolbusClient } from "/static/toolbus.js";
import { bridgeRealtime } from "/static/realtime.js";

/** OpenAI's WebRTC SDP exchange (GA interface). */
export const REALTIME_CALLS_URL = "https://api.openai.com/v1/realtime/calls";

/** The page's own session.update: how the agent behaves (the bridge adds the tools). */
export const INSTRUCTIONS = [
  "You are a friendly voice assistant with tools: notes, unit conversions, the time and reports.",
  "Some tools need the user's confirmation: the app then shows a card; tell the user to",
  "confirm or decline it on screen, and wait. If a tool result says the user declined,",
  "do not retry; ask what to do instead. A report runs in the background: say the message",
  "the tool returns, and when you are told the report is ready, tell the user its summary.",
].join(" ");

/**
 * Open an OpenAI Realtime session over WebRTC (SPEC V3).
 * @param {object} options
 * @param {string} options.ephemeralKey  a client secret (`ek_…`), never a standard API key
 * @param {HTMLAudioElement} [options.audio]  plays the model's voice
 * @param {boolean} [options.microphone=true]  send the microphone; false: listen only
 * @param {typeof fetch} [options.fetchImpl]
 * @returns {Promise<{pc: RTCPeerConnection, channel: RTCDataChannel}>} the data channel
 *          ("oai-events") carries the Realtime events; give it to bridgeRealtime()
 * @throws {Error} when the microphone or OpenAI refuses (message says which)
 */
export async function openRealtime({ ephemeralKey, audio, microphone = true, fetchImpl = globalThis.fetch }) {
  if (!ephemeralKey || !ephemeralKey.startsWith("ek_")) {
    throw new Error("paste an ephemeral key (ek_…) minted with examples/voice/mint_key.py, not an API key");
  }
  const pc = new RTCPeerConnection();
  try {
    pc.ontrack = (event) => { if (audio) audio.srcObject = event.streams[0]; };
    if (microphone) {
      const mic = await navigator.mediaDevices.getUserMedia({ audio: true });
      pc.addTrack(mic.getTracks()[0], mic);
    } else {
      pc.addTransceiver("audio", { direction: "recvonly" });
    }
    const channel = pc.createDataChannel("oai-events");
    const offer = await pc.createOffer();
    await pc.setLocalDescription(offer);
    const reply = await fetchImpl(REALTIME_CALLS_URL, {
      method: "POST",
      body: offer.sdp,
      headers: { Authorization: `Bearer ${ephemeralKey}`, "Content-Type": "application/sdp" },
    });
    if (!reply.ok) throw new Error(`OpenAI refused the call: HTTP ${reply.status} ${(await reply.text()).slice(0, 200)}`);
    await pc.setRemoteDescription({ type: "answer", sdp: await reply.text() });
    return { pc, channel };
  } catch (err) {
    pc.close();
    throw err;
  }
}

// ---------------------------------------------------------------- the page

const $ = (id) => document.getElementById(id);
const session = { client: null, pc: null, channel: null, bridge: null };

function log(text, cls) {
  const line = document.createElement("div");
  line.textContent = text;
  line.dataset.testid = "log-line";
  if (cls) line.className = cls;
  $("log").append(line);
  $("log").scrollTop = $("log").scrollHeight;
}

function setState(state, error = "") {
  $("state").textContent = state;
  $("error").textContent = error;
  $("connect").disabled = state !== "idle";
  $("hangup").disabled = state === "idle";
}

/** Approval card (SPEC A2, A3): the model is told to ask the user to look at it. */
function showCard(card) {
  const box = document.createElement("div");
  box.className = "card";
  box.dataset.testid = "approval-card";
  box.dataset.approvalId = card.approvalId;
  const title = document.createElement("strong");
  title.textContent = `Allow ${card.tool}?`;
  const params = document.createElement("pre");
  params.textContent = JSON.stringify(card.params, null, 2);
  const allow = document.createElement("button");
  allow.textContent = "Allow";
  allow.onclick = () => card.allow();
  const deny = document.createElement("button");
  deny.textContent = "Deny";
  deny.onclick = () => card.deny();
  box.append(title, params, allow, deny);
  $("cards").append(box);
}

function removeCard(resolved) {
  for (const box of $("cards").querySelectorAll(".card")) {
    if (box.dataset.approvalId === resolved.approval_id) box.remove();
  }
  log(`${resolved.tool}: ${resolved.resolution} (${resolved.reason})`);
}

/** What the model says and hears, from the Realtime server events (GA names). */
const SHOWN = {
  "response.output_audio_transcript.done": (e) => log(`agent: ${e.transcript}`, "said"),
  "response.output_text.done": (e) => log(`agent: ${e.text}`, "said"),
  "conversation.item.input_audio_transcription.completed": (e) => log(`you: ${e.transcript}`),
  error: (e) => log(`OpenAI error: ${e.error?.message}`),
};

async function connect() {
  const key = $("ephemeral").value.trim();
  $("ephemeral").value = "";  // used once, for the SDP exchange below
  setState("connecting");
  try {
    const client = new ToolbusClient({ token: $("token").value.trim(), profile: $("profile").value.trim() || null });
    session.client = client;
    await client.connect();
    log(`toolbus: session ${client.sessionId}, ${client.catalog?.tools.length ?? 0} tools`);
    const { pc, channel } = await openRealtime({ ephemeralKey: key, audio: $("audio"), microphone: $("mic").checked });
    Object.assign(session, { pc, channel });
    session.bridge = bridgeRealtime(client, channel, {
      clientTools: { show_map: ({ lat, lon, zoom = 12 }) => (log(`map: ${lat}, ${lon} (zoom ${zoom})`), { shown: true }) },
      onApproval: showCard,
      onResolved: removeCard,
    });
    session.bridge.on("job", ({ tool, text }) => log(`${tool}: ${text}`));
    channel.addEventListener("open", () => {
      channel.send(JSON.stringify({ type: "session.update", session: { type: "realtime", instructions: INSTRUCTIONS } }));
      setState("live");
    });
    channel.addEventListener("message", (event) => {
      const data = JSON.parse(event.data);
      SHOWN[data.type]?.(data);
    });
  } catch (err) {
    hangup();
    setState("idle", String(err.message || err));
  }
}

function hangup() {
  session.bridge?.close();
  session.pc?.close();
  session.client?.close();
  Object.assign(session, { client: null, pc: null, channel: null, bridge: null });
  setState("idle");
}

function say(event) {
  event.preventDefault();
  const text = $("text").value.trim();
  if (!text || !session.channel || session.channel.readyState !== "open") return;
  $("text").value = "";
  log(`you: ${text}`);
  session.channel.send(JSON.stringify({
    type: "conversation.item.create",
    item: { type: "message", role: "user", content: [{ type: "input_text", text }] },
  }));
  session.channel.send(JSON.stringify({ type: "response.create" }));
}

if (typeof document !== "undefined" && $("connect")) {
  $("connect").addEventListener("click", connect);
  $("hangup").addEventListener("click", hangup);
  $("say").addEventListener("submit", say);
  setState("idle");
  document.body.dataset.ready = "true";
}

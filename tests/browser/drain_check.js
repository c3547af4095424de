// Evaluated in the page by test_console.py (page.evaluate): a scripted check of
// gateway/static/toolbus.js. Returns what it saw for the Python side to assert.
(async ({ url }) => {
  const { ToolbusClient } = await import("/static/toolbus.js");
  const client = new ToolbusClient({ url, token: "alice-token", profile: "demo", initialDelay: 100, jitter: 0.2 });
  const seen = { states: [], welcomes: [], hints: [], closes: [] };
  client.on("state", ({ state }) => seen.states.push(state));
  client.on("welcome", (w) => seen.welcomes.push({ resumed: w.resumed, session_id: w.session_id }));
  client.on("reconnect", (m) => seen.hints.push(m));
  client.on("close", (c) => seen.closes.push(c));
  await client.connect();
  const reply = await client.invoke("convert_units", { value: 0, from_unit: "C", to_unit: "K" });
  window.__drainClient = client;
  window.__drainSeen = seen;
  return { reply, sessionId: client.sessionId, lastSeq: client.lastSeq };
})

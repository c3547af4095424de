// Evaluated in the page by test_browser_auth.py (page.evaluate): credential lifetime in
// gateway/static/toolbus.js (SPEC S6). Returns what it saw for the Python side to assert.
(async ({ url, first, fresh, stranger, short }) => {
  const { ToolbusClient } = await import("/static/toolbus.js");
  const waitFor = (client, type, pred = () => true, ms = 8000) => new Promise((resolve, reject) => {
    const timer = setTimeout(() => { off(); reject(new Error("timed out waiting for " + type)); }, ms);
    const off = client.on(type, (detail) => { if (pred(detail)) { clearTimeout(timer); off(); resolve(detail); } });
  });

  // 1. Warned, refused for another user's token, refreshed: the socket outlives the first exp.
  const client = new ToolbusClient({ url, token: first, profile: "demo", ackDelay: 0 });
  const closes = [];
  client.on("close", (c) => closes.push(c));
  const warned = waitFor(client, "auth.expiring");
  await client.connect();
  const warning = await warned;
  let refusedCode = null;
  try { await client.refreshCredentials(stranger); } catch (err) { refusedCode = err.code; }
  const refreshedTo = await client.refreshCredentials(fresh);
  const afterRefresh = client.authExpiring;
  // Nobody answers this approval: it ends declined at the approval timeout, after the first exp.
  const declined = await client.invoke("notes_delete", { note_id: 1 });
  const nowAfterTimeout = Date.now() / 1000;
  const reply = await client.invoke("convert_units", { value: 1, from_unit: "km", to_unit: "m" });
  const stateAfter = client.state;
  const closesBefore = closes.slice();
  client.close();

  // 2. Not refreshed: closed 4004 at exp, not reconnected.
  const lapsing = new ToolbusClient({ url, token: short, profile: "demo", ackDelay: 0 });
  const closed = waitFor(lapsing, "close");
  await lapsing.connect();
  const lapse = await closed;
  return {
    warning, refusedCode, refreshedTo, afterRefresh, declined, nowAfterTimeout, reply,
    stateAfter, closesBefore, lapse, lapsedState: lapsing.state, lapsedWarning: lapsing.authExpiring,
  };
})

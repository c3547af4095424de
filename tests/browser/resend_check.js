// Evaluated in the page by test_call_resend.py (SPEC I15, case F16 in a browser): the
// socket drops while `charge` runs and the session expires before the reconnect, so the
// resume gets `resumed: false`; the client re-sends the call with the same call_id.
(async ({ url }) => {
  const { ToolbusClient } = await import("/static/toolbus.js");
  const client = new ToolbusClient({ url, token: "alice-token", profile: "demo", initialDelay: 800, jitter: 0 });
  const seen = { welcomes: [], resyncs: [], invokes: [] };
  client.on("welcome", (w) => seen.welcomes.push({ resumed: w.resumed, session_id: w.session_id }));
  client.on("resync", (r) => seen.resyncs.push(r));
  await client.connect();
  if (!client.catalog) await new Promise((resolve) => client.on("catalog", resolve));
  const started = new Promise((resolve) => {
    const off = client.on("tool_start", (m) => { if (m.call_id === "pay-b") { off(); resolve(); } });
  });
  const call = client.invoke("charge", { amount: 100 }, { callId: "pay-b" });
  await started;
  const resynced = new Promise((resolve) => client.on("resync", resolve));
  client.simulateDrop();
  await resynced;
  const reply = await call;
  client.close();
  return { seen, reply };
})

// Second phase of drain_check.js, evaluated after the server restarted: wait for the
// resumed session, call a tool on it, close.
(async () => {
  const client = window.__drainClient;
  const seen = window.__drainSeen;
  if (client.state !== "open") {
    await new Promise((resolve) => {
      const off = client.on("state", ({ state }) => {
        if (state === "open") { off(); resolve(); }
      });
    });
  }
  const reply = await client.invoke("convert_units", { value: 1, from_unit: "kg", to_unit: "g" });
  const out = { reply, seen, sessionId: client.sessionId, lastSeq: client.lastSeq };
  client.close();
  return out;
})

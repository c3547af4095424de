// Evaluated in the page by test_console.py: the session expires while the socket is
// down (tiny resume window), so the resume hello gets `resumed: false`.
(async ({ url }) => {
  const { ToolbusClient } = await import("/static/toolbus.js");
  const client = new ToolbusClient({ url, token: "alice-token", profile: "demo", initialDelay: 800, jitter: 0 });
  const seen = { welcomes: [], resyncs: [], catalogs: [] };
  client.on("welcome", (w) => seen.welcomes.push({ resumed: w.resumed, session_id: w.session_id }));
  client.on("resync", (r) => seen.resyncs.push(r));
  client.on("catalog", (c) => seen.catalogs.push(c.seq));
  await client.connect();
  if (!client.catalog) await new Promise((resolve) => client.on("catalog", resolve));
  const resynced = new Promise((resolve) => client.on("resync", resolve));
  client.simulateDrop();
  await resynced;
  const reply = await client.invoke("convert_units", { value: 2, from_unit: "kg", to_unit: "g" });
  const jobs = await client.jobs();
  client.close();
  return { seen, reply, lastSeq: client.lastSeq, jobs: jobs.length };
})

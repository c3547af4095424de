// Evaluated in the page by test_console.py (page.evaluate): a scripted check of
// gateway/static/toolbus.js. Returns what it saw for the Python side to assert.
(async ({ url }) => {
  const { ToolbusClient } = await import("/static/toolbus.js");
  const client = new ToolbusClient({
    url, token: "alice-token", profile: "demo",
    initialDelay: 1200, jitter: 0, ackDelay: 0,   // reconnect after the 0.5 s job is over
  });
  const seen = { states: [], welcomes: [], done: [], rawDone: 0, sent: [], seqs: [] };
  const origSend = WebSocket.prototype.send;
  WebSocket.prototype.send = function (data) { seen.sent.push(JSON.parse(data)); return origSend.call(this, data); };
  const waitFor = (type, pred = () => true, ms = 8000) => new Promise((resolve, reject) => {
    const timer = setTimeout(() => { off(); reject(new Error("timed out waiting for " + type)); }, ms);
    const off = client.on(type, (detail) => { if (pred(detail)) { clearTimeout(timer); off(); resolve(detail); } });
  });
  client.on("state", ({ state }) => seen.states.push(state));
  client.on("welcome", (w) => seen.welcomes.push({ resumed: w.resumed, last_seq: w.last_seq, session_id: w.session_id }));
  client.on("job.done", (m) => seen.done.push(m));
  client.on("message", (m) => { if (m.type === "job.done") seen.rawDone += 1; if (m.seq) seen.seqs.push(m.seq); });

  const first = await client.connect();
  const dispatched = await client.invoke("report", { topic: "resume", sections: 1 });
  const sessionId = client.sessionId;
  const seqBeforeDrop = client.lastSeq;
  const resumed = waitFor("welcome", (w) => w.resumed);
  const done = waitFor("job.done");
  client.simulateDrop();                       // the socket dies; the job keeps running
  await resumed;
  await done;
  const afterResume = client.lastSeq;
  const rawDoneBeforeInjection = seen.rawDone;

  // Dedup by seq: the same job.done frame delivered again is not processed again.
  const seqsBeforeInjection = seen.seqs.slice();
  client._handleFrame(JSON.stringify(seen.done[0]));
  seen.seqs = [];

  // A second drop after everything was acknowledged replays nothing; an invoke made
  // while the socket is down is queued and sent once the session is resumed.
  const again = waitFor("welcome", (w) => w.resumed);
  client.initialDelay = 50;
  client.simulateDrop();
  const queued = client.invoke("convert_units", { value: 100, from_unit: "C", to_unit: "F" });
  await again;
  const queuedReply = await queued;
  const jobs = await client.jobs();
  client.close();
  WebSocket.prototype.send = origSend;
  return {
    first: { resumed: first.resumed, session_id: first.session_id },
    dispatched, sessionId, seqBeforeDrop, afterResume, lastSeq: client.lastSeq,
    states: seen.states, welcomes: seen.welcomes, done: seen.done, rawDone: seen.rawDone, rawDoneBeforeInjection,
    seqsBeforeInjection, seqsAfterSecondResume: seen.seqs, queuedReply, sent: seen.sent, jobs, finalState: client.state,
  };
})

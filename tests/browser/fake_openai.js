// Evaluated in the /voice page by test_voice_page.py: a stand-in for OpenAI's side of the
// WebRTC call, in the same page. The test intercepts the page's SDP POST (the network
// boundary) and answers it with `fakeOpenAI.answer(offer)`, so the page's real
// RTCPeerConnection connects to this one over loopback and the "oai-events" data channel
// really opens. What the page sends on it is recorded; `play` sends server events back.
(() => {
  let opened;
  const ready = new Promise((resolve) => { opened = resolve; });
  const fake = {
    received: [],
    waiters: [],
    channel: null,
    async answer(offerSdp) {
      const pc = new RTCPeerConnection();
      fake.pc = pc;
      pc.ondatachannel = (event) => {
        fake.channel = event.channel;
        event.channel.onmessage = (message) => {
          fake.received.push(JSON.parse(message.data));
          for (const wake of fake.waiters.splice(0)) wake();
        };
        event.channel.onopen = () => opened();
      };
      await pc.setRemoteDescription({ type: "offer", sdp: offerSdp });
      await pc.setLocalDescription(await pc.createAnswer());
      if (pc.iceGatheringState !== "complete") {
        await new Promise((resolve) => {
          pc.onicegatheringstatechange = () => { if (pc.iceGatheringState === "complete") resolve(); };
        });
      }
      return pc.localDescription.sdp;
    },
    ready: () => ready,
    play: (events) => { for (const event of events) fake.channel.send(JSON.stringify(event)); },
    take: (n, ms = 8000) => new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`timed out: have ${JSON.stringify(fake.received)}`)), ms);
      const check = () => {
        if (fake.received.length >= n) {
          clearTimeout(timer);
          resolve(fake.received.splice(0, n));
        } else {
          fake.waiters.push(check);
        }
      };
      check();
    }),
  };
  window.fakeOpenAI = fake;
})();

// The live view of the inbox and the Insights page (included by both templates).
async function follow() {
  // Server-sent events read with fetch, so the token travels in a header, not in the URL.
  const live = $("#live");
  while (state.token) {
    try {
      const response = await fetch("/v1/events", { headers: { "Authorization": "Bearer " + state.token, "Accept": "text/event-stream" } });
      if (!response.ok || !response.body) throw new Error("HTTP " + response.status);
      live.textContent = "○ connecting";
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          // "connected" comes once the stream's start is fixed: from then on nothing is missed
          if (/^: ?connected/m.test(block)) live.textContent = "● live";
          if (/^(data|event):/m.test(block)) scheduleRefresh();
        }
      }
    } catch (err) { /* reconnect below */ }
    live.textContent = "○ reconnecting";
    await new Promise(resolve => setTimeout(resolve, 2000));
  }
}

// The chat page (agents/templates/agents/chat.html): follows /ws/agents/<kind>/<name>/ live.
// Protocol: agents/consumers.py. The server sends a snapshot first; the page asks to resume each
// turn it is rendering after the last seq it rendered, so a reconnect shows every chunk once. A
// reconnect names the newest message the page has (?since=), so the snapshot brings only what it
// missed, and sends its resumes as soon as the socket opens, without waiting for the snapshot.
// A turn's chunks are drawn in seq order: a live chunk can arrive before the replay of the ones
// before it (pushed between the snapshot and the server's reading of the resume), so one that comes
// early is held until those have been drawn (or the replay is complete).
"use strict";
(function () {
  const root = document.getElementById("chat");
  const $ = (id) => document.getElementById(id);
  let socket = null;
  let reconnectTimer = null;
  let retries = 0;
  const messages = new Map();  // id -> message
  const turns = new Map();     // id -> {id, number, status, end_reason}
  const streams = new Map();   // turn id -> {seq, parts: [{kind, text|tool}], notices, finished, held}
  let stateVersion = -1;
  let activeTurn = null;       // the id of the turn drawn as running or waiting (what Stop stops)
  let unanswered = null;       // the text of the message last sent, until the server takes or refuses it
  let resumed = new Set();     // turns asked to resume on the current socket
  let asked = [];              // of those, the ones not answered yet, in the order sent (answers come in it)
  let resumeTimer = null;      // resumeLater's, at most one
  let resumeRetries = 0;
  let whole = true;            // the next socket asks for the whole conversation (no ?since=)
  const ENDED = ["completed", "cancelled", "sealed", "failed"];
  const UNFINISHED = "This answer was interrupted and could not be finished.";

  function clip(text, length) {
    return text.length > length ? text.slice(0, length - 1) + "…" : text;
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (key === "class") node.className = value; else node.setAttribute(key, value);
    }
    for (const child of children) {
      if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  function send(message) {
    if (socket && socket.readyState === WebSocket.OPEN) { socket.send(JSON.stringify(message)); return true; }
    return false;
  }

  // --- the stream of a turn ----------------------------------------------------------------------
  function stream(turnId) {
    if (!streams.has(turnId)) streams.set(turnId, {seq: 0, parts: [], roundStart: 0, refill: null, notices: [], ended: null, finished: false, held: new Map()});
    return streams.get(turnId);
  }

  function words(value) {
    if (value === null || value === undefined) return "";
    if (typeof value !== "object") return String(value);
    return Object.entries(value).map(([k, v]) => k + " " + (typeof v === "object" ? JSON.stringify(v) : v)).join(", ");
  }

  // Chunks held past this many are drawn anyway, gaps and all (the final answer replaces them).
  const MAX_HELD = 1000;

  function applyChunk(msg) {
    const s = stream(msg.turn);
    if (msg.seq <= s.seq) return;  // already rendered (the server sends none twice; a reload may)
    s.held.set(msg.seq, msg);  // drawn once every chunk before it has been
    const before = s.seq;
    drawHeld(s, s.held.size >= MAX_HELD);
    if (s.seq !== before) render();
  }

  // Draw the held chunks in seq order while none is missing before them, or all of them with
  // ``gaps``: once the turn's replay is complete, nothing before them is coming.
  function drawHeld(s, gaps) {
    for (const seq of Array.from(s.held.keys()).sort((a, b) => a - b)) {
      if (!gaps && seq !== s.seq + 1) break;
      draw(s, s.held.get(seq));
      s.held.delete(seq);
    }
  }

  function draw(s, msg) {
    s.seq = msg.seq;
    const data = msg.data || {};
    const last = s.parts[s.parts.length - 1];
    switch (msg.chunk_type) {
      case "text-delta":
        if (s.refill !== null) s.parts[s.refill].text += data.delta || "";
        else if (last && last.kind === "text") last.text += data.delta || "";
        else s.parts.push({kind: "text", text: data.delta || ""});
        break;
      case "data-reset": {  // a recovered round starts its text again, in the place it had: what
        // it wrote so far goes (its tool calls stay: they are not sent twice)
        const own = s.parts.map((part, i) => i).filter((i) => i >= s.roundStart && s.parts[i].kind === "text");
        for (const i of own) s.parts[i].text = "";
        s.refill = own.length ? own[0] : null;
        break;
      }
      case "tool-input-available":
        s.refill = null;
        s.parts.push({kind: "tool", id: data.toolCallId, text: "Using " + data.toolName + (data.input ? " (" + words(data.input) + ")" : "") + "…"});
        break;
      case "tool-output-available":
        for (const part of s.parts) {
          if (part.kind === "tool" && part.id === data.toolCallId) part.text = part.text.replace(/…$/, ": done.");
        }
        s.roundStart = s.parts.length;  // the round ended: what it wrote stays
        s.refill = null;
        break;
      case "data-notice":
        s.notices.push(data.text || "");
        break;
      case "finish":
        s.finished = true;
        if (data.reason === "stopped") s.notices.push("Stopped.");
        break;
    }
  }

  // --- drawing -------------------------------------------------------------------------------------
  function answered(turnId) {
    for (const m of messages.values()) if (m.turn === turnId && m.role === "assistant") return true;
    return false;
  }

  function render() {
    // A sealed or failed turn says why, in words, where its answer would be: the notice it streamed
    // (drawn when it arrives), else the page's own words. A sealed turn's end_reason is written for
    // operators ("stale", "out of recovery budget ..."); a failed one's is the server's sentence.
    for (const t of turns.values()) {
      if ((t.status === "sealed" || t.status === "failed") && !answered(t.id)) {
        stream(t.id).ended = t.status === "failed" && t.end_reason ? t.end_reason : UNFINISHED;
      }
    }
    const list = $("messages");
    list.replaceChildren();
    const ordered = Array.from(messages.values()).sort((a, b) => a.id - b.id);
    const drawn = new Set();
    const drawStream = (turnId) => {
      if (drawn.has(turnId) || answered(turnId) || !streams.has(turnId)) return;
      drawn.add(turnId);
      const s = streams.get(turnId);
      const item = el("li", {class: "streaming", "data-turn": turnId});
      for (const part of s.parts) item.append(part.kind === "text" ? part.text : el("div", {class: "tool"}, part.text));
      const notices = s.notices.length || !s.ended ? s.notices : [s.ended];
      for (const notice of notices) item.append(el("div", {}, el("span", {class: "notice"}, notice)));
      if (!s.parts.length && !notices.length) item.append(el("span", {class: "muted"}, "…"));
      list.append(item);
    };
    for (const m of ordered) {
      if (m.role === "tool") continue;  // tool results are told in the assistant's words
      if (m.role === "assistant" && !m.text) continue;  // a round that only called tools: nothing to read
      const turn = m.turn ? turns.get(m.turn) : null;
      const queued = turn && turn.status === "queued";
      const attrs = {class: "role-" + m.role + (queued ? " queued" : ""), "data-message": m.id};
      if (m.turn) attrs["data-turn"] = m.turn;
      // A message whose turn was stopped before it answered (while queued) was never answered: said so.
      const unanswered = m.role === "user" && turn && turn.status === "cancelled" && !answered(m.turn);
      const note = queued ? "queued"
        : m.parts && m.parts.stopped ? "stopped"
        : unanswered ? "not answered: " + (turn.end_reason || "stopped") : null;
      list.append(el("li", attrs, m.text, note ? el("div", {class: "muted"}, note) : null));
      if (m.role === "user" && m.turn) drawStream(m.turn);
    }
    for (const turnId of streams.keys()) drawStream(turnId);
    if (!list.children.length) list.append(el("li", {class: "muted", id: "empty"}, "No messages yet: say what you need."));
    let active = null;
    for (const t of turns.values()) if (t.status === "running" || t.status === "waiting") active = t;
    activeTurn = active ? active.id : null;
    $("status").textContent = active ? (active.status === "waiting" ? "waiting for an approval" : "answering…") : "";
    $("stop").hidden = !active;
  }

  function renderState(state) {
    const body = $("state-body");
    body.replaceChildren();
    const entries = state && typeof state === "object" ? Object.entries(state) : [];
    if (!entries.length) { body.append(el("p", {class: "muted"}, "Nothing in progress.")); return; }
    const list = el("dl");
    for (const [key, value] of entries) {
      if (value && typeof value === "object" && !Array.isArray(value)) {
        for (const [inner, v] of Object.entries(value)) list.append(el("dt", {}, key + " " + inner), el("dd", {}, words(v)));
      } else {
        list.append(el("dt", {}, key), el("dd", {}, words(value)));
      }
    }
    body.append(list);
  }

  // --- the socket ----------------------------------------------------------------------------------
  function handle(msg) {
    switch (msg.type) {
      case "snapshot":
        retries = 0;
        if (msg.since !== null && msg.more) {
          // More was missed than a snapshot holds: start again from the whole conversation.
          messages.clear();
          whole = true;
          connect();
          return;
        }
        whole = false;
        setConnection("live");
        for (const m of msg.messages) messages.set(m.id, m);
        // A turn this page saw open that is neither active nor queued now ended while it was away.
        const open = new Set(msg.queued.map((q) => q.id).concat(msg.turn ? [msg.turn.id] : []));
        for (const t of turns.values()) if (!ENDED.includes(t.status) && !open.has(t.id)) t.status = "ended";
        for (const q of msg.queued) turns.set(q.id, q);
        for (const t of msg.stopped || []) turns.set(t.id, t);  // stopped before answering: said so below
        if (msg.turn) turns.set(msg.turn.id, Object.assign({end_reason: ""}, msg.turn));
        if (msg.state_version > stateVersion) { stateVersion = msg.state_version; renderState(msg.state); }
        // Resume the active turn, and any turn this page was drawing when the connection dropped.
        if (msg.turn) stream(msg.turn.id);
        resumeAll();
        render();
        break;
      case "chunk":
        applyChunk(msg);
        break;
      case "replay_complete": {
        if (asked.includes(msg.turn)) asked.splice(asked.indexOf(msg.turn), 1);
        resumeRetries = 0;
        // An ended turn whose replay is complete has nothing more to come: not asked again.
        const status = (turns.get(msg.turn) || {}).status;
        if (streams.has(msg.turn) && (ENDED.includes(status) || status === "ended")) streams.get(msg.turn).finished = true;
        if (streams.has(msg.turn) && streams.get(msg.turn).held.size) {
          drawHeld(streams.get(msg.turn), true);
          render();
        }
        break;
      }
      case "turn": {
        unanswered = null;  // the server took it (its turn comes first), or this is another's news
        const known = turns.get(msg.id);
        if (known && ENDED.includes(known.status)) break;  // an ended turn never changes again
        turns.set(msg.id, msg);
        if (msg.status === "running" || msg.status === "waiting") stream(msg.id);
        render();
        break;
      }
      case "message":
        messages.set(msg.id, msg);
        render();
        break;
      case "state":
        if (msg.version > stateVersion) { stateVersion = msg.version; renderState(msg.state); }
        break;
      case "error":
        // The answer to something this page sent, said where the customer looks. A message the
        // server would not take (a full queue, too long) gives its text back; the refusal of a
        // resume or a stop (an error "about" something else) leaves a message sent since alone, as
        // it may well be taken. The server answers the page's frames in the order sent, so a
        // refused resume is the oldest one unanswered; refused unread (too many at once:
        // "retry_after"), it is asked again once the server reads one more.
        $("notice").textContent = msg.message;
        $("notice").hidden = false;
        if (msg.about === "message") {
          // The text goes back where it was written; if something new is there already, the
          // notice quotes it instead, so it is not lost from sight either.
          if (unanswered !== null && !$("text").value) $("text").value = unanswered;
          else if (unanswered !== null) $("notice").textContent += ` Not sent: “${clip(unanswered, 200)}”`;
          unanswered = null;
        } else if (msg.about === "resume") {
          const refused = asked.shift();
          if (msg.retry_after && refused !== undefined) {
            resumed.delete(refused);
            resumeLater(msg.retry_after);
          }
        }
        break;
    }
  }

  // Ask the server for what this page lacks of each turn it is drawing (each once per socket: a
  // second resume would send nothing new).
  function resumeAll() {
    for (const [turnId, s] of streams) {
      if (s.finished || answered(turnId) || resumed.has(turnId)) continue;
      if (send({type: "resume", turn: turnId, after: s.seq})) { resumed.add(turnId); asked.push(turnId); }
    }
  }

  // Resumes the server refused unread (too many frames at once: it says when it reads one more)
  // are asked again by one timer, however many were refused, backing off while they keep being
  // refused.
  function resumeLater(seconds) {
    if (resumeTimer !== null) return;
    const current = socket;
    const delay = Math.min(10000, Math.max(1000 * seconds, 250 * 2 ** resumeRetries));
    resumeRetries += 1;
    resumeTimer = setTimeout(() => {
      resumeTimer = null;
      if (socket !== current) return;  // a new socket resumes on its own
      resumeAll();
    }, delay);
  }

  function newestMessage() {
    let newest = null;
    for (const id of messages.keys()) if (newest === null || id > newest) newest = id;
    return newest;
  }

  function setConnection(text) {
    $("connection").textContent = text;
  }

  // One socket at a time: a reconnect (the backoff's timer, or the browser coming back online)
  // replaces the socket, and whatever an old one still delivers is ignored.
  function drop() {
    if (!socket) return;
    socket.onopen = socket.onclose = socket.onmessage = null;
    socket.close();
    socket = null;
  }

  function retry() {
    // Exponential backoff with jitter, capped, so a restarted server is not stampeded.
    const delay = Math.min(10000, 500 * 2 ** retries) * (0.5 + Math.random() / 2);
    retries += 1;
    setConnection((navigator.onLine ? "" : "offline: ") + "reconnecting in " + Math.ceil(delay / 1000) + " s");
    clearTimeout(reconnectTimer);
    reconnectTimer = setTimeout(connect, delay);
  }

  function connect() {
    clearTimeout(reconnectTimer);
    reconnectTimer = null;
    drop();
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const newest = whole ? null : newestMessage();
    const path = root.dataset.wsPath + (newest === null ? "" : (root.dataset.wsPath.includes("?") ? "&" : "?") + "since=" + newest);
    const current = socket = new WebSocket(scheme + location.host + path);
    resumed = new Set();
    asked = [];
    clearTimeout(resumeTimer);
    resumeTimer = null;
    resumeRetries = 0;
    setConnection("connecting…");
    current.onopen = () => resumeAll();
    current.onmessage = (message) => handle(JSON.parse(message.data));
    current.onclose = (event) => {
      socket = null;
      if (event.code === 4401 || event.code === 4404) {
        setConnection(event.code === 4401 ? "signed out: reload to sign in" : "agent not found");
        return;
      }
      retry();
    };
  }

  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("text").value;
    if (!text.trim()) return;
    $("notice").hidden = true;
    if (send({type: "message", text})) { $("text").value = ""; unanswered = text; }
    else setConnection("not connected: your message was not sent");
  });
  // The turn this page shows running: a Stop meant for it never stops the next one, should it
  // have ended meanwhile (the server answers that it has ended instead).
  $("stop").addEventListener("click", () => { if (activeTurn) send({type: "stop", turn: activeTurn}); });
  // Offline, a socket can stay open for minutes with nothing arriving, and closing it can wait as
  // long for the server's answer: let it go now. Back online, reconnect at once, not at the
  // backoff's next try.
  window.addEventListener("offline", () => { drop(); retry(); });
  window.addEventListener("online", () => {
    if (socket && socket.readyState === WebSocket.OPEN) return;
    retries = 0;
    connect();
  });

  connect();
})();

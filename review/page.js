// imagepipe review: every text is set with textContent (names are never markup); decisions go to the server at
// once, which appends them to the review file before it answers.
"use strict";
const token = new URLSearchParams(location.search).get("token");
const api = (path) => path + (path.includes("?") ? "&" : "?") + "token=" + encodeURIComponent(token);
let state = null, shown = [], current = 0, picking = null, chosen = new Set();
const PAGE = 300;  // cards drawn at a time: thousands of suspects stay quick; more are drawn as the reviewer nears them
let limit = PAGE;

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  if (cls) node.className = cls;
  return node;
}

function decisionText(d) {
  if (!d) return "";
  return d.action === "relabel" ? "relabelled to " + d.new_label : d.action === "keep" ? "kept" : "excluded";
}

function render() {
  const reason = document.getElementById("reason").value, cls = document.getElementById("class").value;
  shown = state.items.filter((it) => (!reason || it.kinds.includes(reason)) &&
                                     (!cls || it.given === cls || it.suggested === cls));
  const main = document.getElementById("items");
  main.replaceChildren();
  shown.slice(0, limit).forEach((it, n) => {
    const card = el("section", undefined, "item" + (n === current ? " current" : ""));
    card.dataset.id = it.id;
    const img = el("img");
    img.alt = it.path;
    img.loading = "lazy";
    img.src = api("image/" + it.id);
    img.addEventListener("click", () => { current = n; enlarge(); });
    card.append(img, el("div", it.path, "path"));
    card.append(el("div", "given: " + (it.given || "(none)") + (it.split ? " \u00b7 " + it.split : "")));
    if (it.suggested) {
      const sure = it.confidence === null ? "" : " (" + Number(it.confidence).toFixed(2) + ")";
      card.append(el("div", "suggested: " + it.suggested + sure));
    }
    const reasons = el("ul", undefined, "reasons");
    it.reasons.forEach((r) => reasons.append(el("li", r)));
    card.append(reasons);
    card.append(el("div", decisionText(it.decision), "decision " + (it.decision ? it.decision.action : "")));
    card.addEventListener("click", () => { current = n; mark(); });
    main.append(card);
  });
  if (shown.length > limit) {
    const more = el("button", (shown.length - limit) + " more: show " + Math.min(PAGE, shown.length - limit));
    more.addEventListener("click", () => { limit += PAGE; render(); });
    main.append(more);
  }
  progress();
}

function progress() {
  const done = state.items.filter((it) => it.decision).length;
  document.getElementById("progress").textContent = done + " of " + state.items.length + " reviewed";
}

function mark() {
  if (current >= limit - 20 && shown.length > limit) { limit += PAGE; render(); }
  document.querySelectorAll(".item").forEach((node, n) => node.classList.toggle("current", n === current));
  const node = document.querySelectorAll(".item")[current];
  if (node) node.scrollIntoView({block: "nearest"});
}

let queue = Promise.resolve();  // one decision at a time, in the order they were made

function decide(action, newLabel) {
  // The image and its card are taken when the key is pressed; the page moves on at once, and the server hears
  // the decisions one after another (each is appended to the review file before it answers).
  const it = shown[current], card = document.querySelectorAll(".item")[current];
  if (!it) return;
  const badge = card.querySelector(".decision"), before = it.decision;
  it.decision = {action: action, new_label: newLabel || ""};
  badge.textContent = "saving: " + decisionText(it.decision);
  badge.className = "decision " + action;
  progress();
  const next = shown.findIndex((x, n) => n > current && !x.decision);
  current = next >= 0 ? next : Math.min(current + 1, shown.length - 1);
  mark();
  queue = queue.then(async () => {
    const answer = await fetch(api("decide"), {method: "POST", headers: {"Content-Type": "application/json"},
                                              body: JSON.stringify({item: it.id, action: action, new_label: newLabel || ""})});
    const body = await answer.json();
    if (!answer.ok) throw new Error(body.error);
    it.decision = body;
    badge.textContent = decisionText(body);
  }).catch((error) => {
    it.decision = before;
    badge.textContent = "not kept: " + error.message;
    badge.className = "decision";
    progress();
  });
}

function openPicker() {
  // Single-label: one class, the suggestion first in line. Multi-label: the image's labels, each toggled on or off.
  const it = shown[current];
  if (!it) return;
  picking = Math.max(0, state.classes.indexOf(it.suggested));
  chosen = new Set(state.multi_label ? (it.given || "").split(";").filter((x) => x) : []);
  drawPicker();
  document.getElementById("picker").style.display = "block";
}

function drawPicker() {
  const list = document.getElementById("choices");
  list.replaceChildren();
  state.classes.forEach((name, n) => {
    const text = state.multi_label ? (chosen.has(name) ? "[x] " : "[ ] ") + name : name;
    list.append(el("li", text, n === picking ? "chosen" : ""));
  });
}

function pick(n) {
  const name = state.classes[n];
  if (!state.multi_label) { closeOverlays(); decide("relabel", name); return; }
  if (chosen.has(name)) chosen.delete(name); else chosen.add(name);
  picking = n;
  drawPicker();
}

function closeOverlays() {
  picking = null;
  document.getElementById("picker").style.display = "none";
  document.getElementById("large").style.display = "none";
}

function enlarge() {
  const it = shown[current];
  if (!it) return;
  document.getElementById("large-image").src = api("image/" + it.id + "?large=1");
  document.getElementById("large").style.display = "block";
}

document.addEventListener("keydown", (event) => {
  if (event.target.tagName === "SELECT") return;
  if (picking !== null) {
    if (event.key === "Escape") closeOverlays();
    else if (/^[1-9]$/.test(event.key) && Number(event.key) <= state.classes.length) pick(Number(event.key) - 1);
    else if (event.key === "ArrowDown" || event.key === "ArrowUp") {
      picking = (picking + (event.key === "ArrowDown" ? 1 : state.classes.length - 1)) % state.classes.length;
      drawPicker();
    } else if (event.key === " " && state.multi_label) pick(picking);
    else if (event.key === "Enter") {
      if (!state.multi_label) pick(picking);
      else { const labels = [...chosen].sort().join(";"); closeOverlays(); decide("relabel", labels); }
    }
    event.preventDefault();
    return;
  }
  const keys = {
    ArrowRight: () => { current = Math.min(current + 1, shown.length - 1); mark(); },
    ArrowLeft: () => { current = Math.max(current - 1, 0); mark(); },
    k: () => decide("keep"),
    x: () => decide("exclude"),
    r: openPicker,
    s: () => {  // the suggestion: the class; multi-label: the image's labels and the suggested one
      const it = shown[current];
      if (!it || !it.suggested) return;
      const labels = new Set(state.multi_label ? (it.given || "").split(";").filter((x) => x) : []);
      labels.add(it.suggested);
      decide("relabel", [...labels].sort().join(";"));
    },
    " ": () => (document.getElementById("large").style.display === "block" ? closeOverlays() : enlarge()),
    Escape: closeOverlays,
  };
  if (keys[event.key]) { event.preventDefault(); keys[event.key](); }
});

document.getElementById("large").addEventListener("click", closeOverlays);

async function start() {
  state = await (await fetch(api("state"))).json();
  const reasons = new Set(), classes = new Set(state.classes);
  state.items.forEach((it) => { it.kinds.forEach((k) => reasons.add(k)); });
  for (const [id, values] of [["reason", reasons], ["class", classes]]) {
    const select = document.getElementById(id);
    [...values].sort().forEach((v) => { const o = el("option", v); o.value = v; select.append(o); });
    select.addEventListener("change", () => { current = 0; limit = PAGE; render(); });
  }
  document.getElementById("file").textContent = "decisions: " + state.file;
  render();
  document.body.dataset.ready = "1";
}
start();

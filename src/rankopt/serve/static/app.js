// The search page of `rankopt serve`: drop or pick an image -> POST search (multipart); click a
// result -> POST search {"id": ...} (more like this). Every value from the service is written as
// text (never as HTML). With a token, API calls send it as a bearer token and thumbnails are
// fetched with it.
"use strict";

const $ = (id) => document.getElementById(id);
let token = sessionStorage.getItem("rankopt-token") || "";
let generation = 0; // the latest search; answers of older ones are dropped

function authorized(headers = {}) {
  return token ? { ...headers, Authorization: `Bearer ${token}` } : headers;
}

async function api(path, options = {}) {
  const response = await fetch(path, { ...options, headers: authorized(options.headers) });
  if (response.status === 401) {
    $("token-row").hidden = false;
    throw new Error("this service needs a token: enter it in the token field");
  }
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try { message = (await response.json()).error || message; } catch (_) { /* not JSON */ }
    throw new Error(message);
  }
  return response;
}

function setStatus(text, error = false) {
  $("status").textContent = text;
  $("status").classList.toggle("error", error);
}

async function thumbnailSource(id) {
  const path = `thumbnails/${encodeURIComponent(id)}`;
  if (!token) return path;
  return URL.createObjectURL(await (await api(path)).blob());
}

function options() {
  const k = Number.parseInt($("k").value, 10) || 12;
  const text = $("filter").value.trim();
  let filter = null;
  if (text) {
    try { filter = JSON.parse(text); } catch (_) { filter = text; }
  }
  return { k, filter, filterText: text };
}

function showQuery(src, name) {
  const image = $("query-image");
  image.onerror = () => { image.hidden = true; $("drop-text").hidden = false; };
  image.src = src;
  image.hidden = false;
  $("drop-text").hidden = true;
  $("query-name").textContent = name;
}

async function search(request, label) {
  const mine = ++generation;
  setStatus(`searching with ${label}…`);
  const start = performance.now();
  try {
    const record = await (await request()).json();
    if (mine !== generation) return;
    render(record);
    const took = Math.round(performance.now() - start);
    setStatus(`top ${record.results.length} for ${label} (${took} ms)${record.note ? ` — ${record.note}` : ""}`);
  } catch (error) {
    if (mine === generation) setStatus(error.message, true);
  }
}

function searchFile(file) {
  if (!file) return;
  showQuery(URL.createObjectURL(file), file.name);
  const { k, filterText } = options();
  const form = new FormData();
  form.append("image", file, file.name);
  if (filterText) form.append("filter", filterText);
  search(() => api(`search?k=${k}`, { method: "POST", body: form }), file.name);
}

async function searchItem(result) {
  showQuery(await thumbnailSource(result.id).catch(() => ""), `item ${result.id}${result.label != null ? ` (${result.label})` : ""}`);
  const { k, filter } = options();
  const body = { id: result.id, k };
  if (filter !== null) body.filter = filter;
  search(() => api("search", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) }),
         `item ${result.id}`);
}

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function card(result) {
  const button = element("button", "result");
  button.type = "button";
  button.dataset.id = result.id;
  button.title = `${result.path ?? `item ${result.id}`}\nclick: more like this`;
  const image = element("img");
  image.alt = result.label != null ? String(result.label) : `item ${result.id}`;
  image.loading = "lazy";
  thumbnailSource(result.id).then((src) => { image.src = src; }).catch(() => { image.alt = "no thumbnail"; });
  const head = element("div", "head");
  head.append(element("span", "rank", `#${result.rank}`), element("span", "score", result.score.toFixed(4)));
  if ("match" in result) {
    head.append(element("span", result.match ? "badge" : "badge no", result.match ? "match" : "no match"));
    if (!result.match) button.classList.add("no-match");
  }
  button.append(image, head);
  if (result.label != null) button.append(element("div", "label", String(result.label)));
  if (result.path) button.append(element("div", "path", result.path.split(/[\\/]/).pop()));
  const metadata = Object.entries(result.metadata || {});
  if (metadata.length) {
    const list = element("dl");
    for (const [key, value] of metadata) {
      const row = element("div");
      row.append(element("dt", "", key), element("dd", "", typeof value === "object" ? JSON.stringify(value) : String(value)));
      list.append(row);
    }
    button.append(list);
  }
  button.addEventListener("click", () => searchItem(result));
  return button;
}

function render(record) {
  $("empty").hidden = true;
  $("results").replaceChildren(...record.results.map(card));
}

function setUp() {
  const drop = $("drop");
  $("file").addEventListener("change", (event) => {
    searchFile(event.target.files[0]);
    event.target.value = ""; // picking the same file again searches again
  });
  for (const name of ["dragenter", "dragover"]) {
    drop.addEventListener(name, (event) => { event.preventDefault(); drop.classList.add("over"); });
  }
  for (const name of ["dragleave", "drop"]) {
    drop.addEventListener(name, (event) => { event.preventDefault(); drop.classList.remove("over"); });
  }
  drop.addEventListener("drop", (event) => searchFile(event.dataTransfer.files[0]));
  $("token").value = token;
  $("token-row").hidden = !token;
  $("token").addEventListener("change", (event) => {
    token = event.target.value.trim();
    sessionStorage.setItem("rankopt-token", token);
  });
  fetch("health").then((response) => response.json()).then((health) => {
    $("index-info").textContent =
      `${health.items} items · ${health.dim}-d · ${health.search} · fingerprint ${health.fingerprint}`;
  }).catch(() => { $("index-info").textContent = "the service does not answer"; });
}

setUp();

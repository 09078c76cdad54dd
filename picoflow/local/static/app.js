// The chat page and session inspector of `picoflow serve`.
//
// The chat talks to the same HTTP API as any other client (GET /ai/flows, POST /ai/run, POST /ai/end,
// the session id in the CHAT_SESSION_ID header; attached files go through POST /ai/files and the upload
// URL it answers, then their ids ride on the turn); the inspector reads the stored session document through
// the local-only GET /ai/session after every turn. Turns are asked for as server-sent events, so a reply is
// shown as the model writes it; text the server takes back (`reset`) or never commits is marked as such.
//
// Safety rule for the whole file: model and user text only ever reaches the page as text nodes
// (`append(string)`, `textContent`) or checked attribute values, never through innerHTML. The markdown
// renderer therefore builds DOM nodes itself instead of producing an HTML string.
'use strict';

(() => {
  const SESSION_HEADER = 'CHAT_SESSION_ID';
  const SESSION_ID = /^[A-Za-z0-9_-]{1,128}$/;
  // A little above the function's 25 s timeout, so the server's own answer arrives first.
  const TURN_TIMEOUT_MS = 35000;

  const $ = (id) => document.getElementById(id);
  const ui = {
    flow: $('flow'), newChat: $('new-chat'), status: $('status'),
    configBox: $('config-box'), config: $('config'), configError: $('config-error'),
    transcript: $('transcript'), composer: $('composer'), message: $('message'), send: $('send'),
    attach: $('attach'), attachInput: $('attach-input'), attached: $('attached'),
    empty: $('inspector-empty'), body: $('inspector-body'), head: $('session-head'), refresh: $('refresh'),
    diagram: $('diagram'), path: $('path'), states: $('states'), memory: $('memory'),
    tokens: $('tokens'), logs: $('logs'), raw: $('raw'), rawBody: $('raw-body'),
    approvals: $('approvals'),
  };

  // `session` is the live session the next turn continues; `inspected` is the one the inspector shows,
  // which outlives `session` when a flow completes (its document stays readable).
  // `toggled` holds the parts of the inspector the reader opened or closed, by key.
  const state = {
    session: null, inspected: null, busy: false, turns: 0, doc: null, toggled: new Map(), files: [],
  };

  // -- DOM helpers ----------------------------------------------------------------------------------

  /** An element with attributes and children; strings become text nodes, so they are never parsed. */
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (name === 'class') node.className = value;
      else node.setAttribute(name, value === true ? '' : String(value));
    }
    node.append(...children.filter((child) => child !== undefined && child !== null && child !== false));
    return node;
  }

  const SVG_NS = 'http://www.w3.org/2000/svg';
  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
    node.append(...children);
    return node;
  }

  function setStatus(text, isError) {
    ui.status.textContent = text || '';
    ui.status.classList.toggle('error', Boolean(isError));
  }

  // -- markdown ---------------------------------------------------------------------------------------
  // A small CommonMark/GFM subset that covers what models write: headings, paragraphs (a single newline
  // is kept as a line break, as chat replies expect), emphasis, code, links, lists, quotes, rules and tables.

  const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)/;
  const HEADING = /^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$/;
  const RULE = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
  const QUOTE = /^ {0,3}> ?(.*)$/;
  const LIST_ITEM = /^( *)([-*+]|\d{1,9}[.)])[ \t]+(.*)$/;
  const TABLE_RULE = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;
  const INLINE = new RegExp([
    '(`+)([^`]|[^`][\\s\\S]*?[^`])\\1(?!`)', // 1, 2: code span
    '\\*\\*(?=\\S)([\\s\\S]*?\\S)\\*\\*', // 3: strong
    '(?<!\\w)__(?=\\S)([\\s\\S]*?\\S)__(?!\\w)', // 4: strong
    '\\*(?=[^\\s*])([\\s\\S]*?[^\\s*])\\*', // 5: emphasis
    '(?<!\\w)_(?=[^\\s_])([\\s\\S]*?[^\\s_])_(?!\\w)', // 6: emphasis (not inside snake_case words)
    '~~(?=\\S)([\\s\\S]*?\\S)~~', // 7: strikethrough
    '\\[([^\\]\\n]+)\\]\\(\\s*<?([^\\s)>]+)>?(?:\\s+"[^"]*")?\\s*\\)', // 8, 9: link
    '(https?:\\/\\/[^\\s<>()]*[^\\s<>().,;:!?\'"*_])', // 10: bare URL
    '\\\\([\\\\`*_{}\\[\\]()#+\\-.!|~>])', // 11: backslash escape
  ].join('|'), 'g');

  function renderMarkdown(text) {
    const box = el('div', { class: 'markdown' });
    renderBlocks(String(text).replace(/\r\n?/g, '\n').split('\n'), box);
    return box;
  }

  function leading(line) {
    return line.length - line.trimStart().length;
  }

  function startsBlock(lines, i) {
    const line = lines[i];
    return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) ||
      LIST_ITEM.test(line) || isTableStart(lines, i);
  }

  function renderBlocks(lines, parent) {
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      let m;
      if (!line.trim()) {
        i += 1;
      } else if ((m = FENCE.exec(line))) {
        const fence = m[1];
        const body = [];
        i += 1;
        while (i < lines.length && !lines[i].trim().startsWith(fence)) body.push(lines[i++]);
        i += 1; // the closing fence (or the end of the text)
        parent.append(el('pre', { class: 'code' }, el('code', { 'data-lang': m[2] || undefined }, body.join('\n'))));
      } else if ((m = HEADING.exec(line))) {
        parent.append(renderInline(m[2], el(`h${m[1].length}`)));
        i += 1;
      } else if (RULE.test(line)) {
        parent.append(el('hr'));
        i += 1;
      } else if (isTableStart(lines, i)) {
        i = renderTable(lines, i, parent);
      } else if (QUOTE.test(line)) {
        const body = [];
        while (i < lines.length && (m = QUOTE.exec(lines[i]))) {
          body.push(m[1]);
          i += 1;
        }
        const quote = el('blockquote');
        renderBlocks(body, quote);
        parent.append(quote);
      } else if (LIST_ITEM.test(line)) {
        i = renderList(lines, i, parent);
      } else {
        const paragraph = el('p');
        let first = true;
        while (i < lines.length && lines[i].trim() && (first || !startsBlock(lines, i))) {
          if (!first) paragraph.append(el('br'));
          renderInline(lines[i].trim(), paragraph);
          first = false;
          i += 1;
        }
        parent.append(paragraph);
      }
    }
    return parent;
  }

  function renderList(lines, i, parent) {
    const first = LIST_ITEM.exec(lines[i]);
    const indent = first[1].length;
    const ordered = /\d/.test(first[2]);
    const list = el(ordered ? 'ol' : 'ul');
    if (ordered && parseInt(first[2], 10) !== 1) list.start = parseInt(first[2], 10);
    while (i < lines.length) {
      const m = LIST_ITEM.exec(lines[i]);
      if (!m || m[1].length !== indent || /\d/.test(m[2]) !== ordered) break;
      // An item owns the lines indented past its marker (nested lists, continued text) and lazy continuations.
      const contentIndent = m[1].length + m[2].length + 1;
      const body = [m[3]];
      i += 1;
      while (i < lines.length) {
        const next = lines[i];
        if (!next.trim()) {
          let j = i;
          while (j < lines.length && !lines[j].trim()) j += 1;
          if (j < lines.length && leading(lines[j]) > indent) {
            while (i < j) { body.push(''); i += 1; }
            continue;
          }
          break;
        }
        const lead = leading(next);
        if (lead > indent) {
          body.push(next.slice(Math.min(lead, contentIndent)));
        } else if (startsBlock(lines, i)) {
          break;
        } else {
          body.push(next.trim());
        }
        i += 1;
      }
      const item = el('li');
      if (body.length === 1) renderInline(body[0], item);
      else renderBlocks(body, item);
      list.append(item);
      // Blank lines between two items of the same list keep it one (loose) list.
      let j = i;
      while (j < lines.length && !lines[j].trim()) j += 1;
      const again = j < lines.length && LIST_ITEM.exec(lines[j]);
      if (j > i && again && again[1].length === indent && /\d/.test(again[2]) === ordered) i = j;
    }
    parent.append(list);
    return i;
  }

  function splitRow(line) {
    let text = line.trim();
    if (text.startsWith('|')) text = text.slice(1);
    if (text.endsWith('|') && !text.endsWith('\\|')) text = text.slice(0, -1);
    const cells = [];
    let cell = '';
    for (let k = 0; k < text.length; k += 1) {
      if (text[k] === '\\' && text[k + 1] === '|') {
        cell += '|';
        k += 1;
      } else if (text[k] === '|') {
        cells.push(cell.trim());
        cell = '';
      } else {
        cell += text[k];
      }
    }
    cells.push(cell.trim());
    return cells;
  }

  function isTableStart(lines, i) {
    const header = lines[i];
    const rule = lines[i + 1];
    return rule !== undefined && header.includes('|') && rule.includes('|') && rule.includes('-') &&
      TABLE_RULE.test(rule) && splitRow(header).length === splitRow(rule).length;
  }

  function renderTable(lines, i, parent) {
    const header = splitRow(lines[i]);
    const aligns = splitRow(lines[i + 1]).map((cell) => {
      if (cell.startsWith(':') && cell.endsWith(':')) return 'center';
      if (cell.endsWith(':')) return 'right';
      return cell.startsWith(':') ? 'left' : '';
    });
    const cellOf = (tag, text, column) =>
      renderInline(text, el(tag, { class: aligns[column] ? `align-${aligns[column]}` : undefined }));
    const thead = el('thead', {}, el('tr', {}, ...header.map((text, column) => cellOf('th', text, column))));
    const tbody = el('tbody');
    i += 2;
    while (i < lines.length && lines[i].trim() && lines[i].includes('|')) {
      const cells = splitRow(lines[i]);
      tbody.append(el('tr', {}, ...header.map((_, column) => cellOf('td', cells[column] || '', column))));
      i += 1;
    }
    // Wide tables scroll inside the bubble instead of stretching the chat.
    parent.append(el('div', { class: 'table-wrap' }, el('table', {}, thead, tbody)));
    return i;
  }

  function safeUrl(text) {
    try {
      const url = new URL(text, window.location.href);
      return ['http:', 'https:', 'mailto:'].includes(url.protocol) ? url.href : null;
    } catch {
      return null;
    }
  }

  function renderInline(text, parent) {
    let last = 0;
    for (const m of text.matchAll(INLINE)) {
      if (m.index > last) parent.append(text.slice(last, m.index));
      if (m[1] !== undefined) {
        // One space on each side of a code span is padding, as in CommonMark.
        const padded = m[2].length > 2 && m[2].startsWith(' ') && m[2].endsWith(' ');
        parent.append(el('code', {}, padded ? m[2].slice(1, -1) : m[2]));
      } else if (m[3] !== undefined || m[4] !== undefined) {
        parent.append(renderInline(m[3] ?? m[4], el('strong')));
      } else if (m[5] !== undefined || m[6] !== undefined) {
        parent.append(renderInline(m[5] ?? m[6], el('em')));
      } else if (m[7] !== undefined) {
        parent.append(renderInline(m[7], el('del')));
      } else if (m[8] !== undefined) {
        const href = safeUrl(m[9]);
        // A link with a scheme other than http(s)/mailto (javascript:, data: ...) stays plain text.
        parent.append(href ? renderInline(m[8], link(href)) : m[0]);
      } else if (m[10] !== undefined) {
        const href = safeUrl(m[10]);
        parent.append(href ? link(href, m[10]) : m[10]);
      } else {
        parent.append(m[11]);
      }
      last = m.index + m[0].length;
    }
    if (last < text.length) parent.append(text.slice(last));
    return parent;
  }

  function link(href, text) {
    return el('a', { href, target: '_blank', rel: 'noopener noreferrer' }, text);
  }

  // -- JSON -------------------------------------------------------------------------------------------

  const JSON_TOKEN = /("(?:[^"\\]|\\.)*")(\s*:)?|\b(true|false|null)\b|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?/g;

  /** Pretty-printed JSON with keys, strings, numbers and literals in their own (text-only) spans. */
  function jsonBlock(value, className) {
    const text = JSON.stringify(value, null, 2) ?? String(value);
    const pre = el('pre', { class: `json ${className || ''}`.trim() });
    let last = 0;
    for (const m of text.matchAll(JSON_TOKEN)) {
      if (m.index > last) pre.append(text.slice(last, m.index));
      const kind = m[1] !== undefined ? (m[2] ? 'key' : 'str') : m[3] !== undefined ? 'lit' : 'num';
      pre.append(el('span', { class: `j-${kind}` }, m[1] ?? m[0]));
      if (m[2]) pre.append(m[2]);
      last = m.index + m[0].length;
    }
    if (last < text.length) pre.append(text.slice(last));
    return pre;
  }

  // -- the chat ---------------------------------------------------------------------------------------

  function addToTranscript(node) {
    ui.transcript.append(node);
    ui.transcript.scrollTop = ui.transcript.scrollHeight;
    return node;
  }

  function userTurn(text) {
    const who = el('div', { class: 'who' }, 'you');
    return addToTranscript(el('li', { class: 'turn user' }, who, el('div', { class: 'text' }, text)));
  }

  function botTurn(contentType, content) {
    const label = contentType && !contentType.startsWith('text/plain') ? `bot · ${contentType}` : 'bot';
    const attrs = { class: 'turn bot', 'data-content-type': contentType || undefined };
    return addToTranscript(el('li', attrs, el('div', { class: 'who' }, label), content));
  }

  function note(text, isError) {
    return addToTranscript(el('li', { class: isError ? 'note error' : 'note' }, text));
  }

  /** A reply body shown by its content type: markdown for text, pretty JSON, images, anything else as text. */
  async function replyContent(response, contentType) {
    const type = contentType.split(';')[0].trim().toLowerCase();
    if (type.startsWith('image/')) {
      // Read as bytes and shown from a blob: URL, so even an SVG image cannot run script.
      return el('img', { class: 'reply-image', src: URL.createObjectURL(await response.blob()), alt: `${type} reply` });
    }
    return textReply(type, await response.text());
  }

  /** A textual reply shown by its (lower-case, parameter-free) content type. */
  function textReply(type, text) {
    if (type === 'application/json' || type.endsWith('+json')) {
      try {
        return jsonBlock(JSON.parse(text));
      } catch {
        return el('pre', { class: 'raw' }, text);
      }
    }
    if (type === 'text/markdown' || type === 'text/plain' || type === '') return renderMarkdown(text);
    // HTML, XML, CSV and the rest are shown as their source: never interpreted.
    return el('pre', { class: 'raw' }, text);
  }

  function readConfig() {
    const text = ui.config.value.trim();
    if (!text) return { ok: true, value: null };
    try {
      const value = JSON.parse(text);
      if (value === null || typeof value !== 'object' || Array.isArray(value)) {
        return { ok: false, error: 'Config must be a JSON object, e.g. {"currentDate": "2026-03-22"}.' };
      }
      return { ok: true, value };
    } catch (error) {
      return { ok: false, error: `Config is not valid JSON: ${error.message}` };
    }
  }

  function setBusy(busy) {
    state.busy = busy;
    document.body.dataset.busy = String(busy);
    ui.send.disabled = busy;
    ui.attach.disabled = busy;
    ui.newChat.disabled = busy;
    lockSessionControls();
  }

  // The flow and the config only apply when a session starts, so they are locked while one is live.
  function lockSessionControls() {
    const live = Boolean(state.session);
    ui.flow.disabled = live || state.busy;
    ui.config.disabled = live || state.busy;
    ui.configBox.classList.toggle('locked', live);
  }

  function setSession(id) {
    state.session = id;
    lockSessionControls();
  }

  function showInspected(id) {
    // What the reader opened in one session's inspector says nothing about the next session's.
    if (id !== state.inspected) state.toggled.clear();
    state.inspected = id;
    // The address keeps the session, so a reload reopens it in the inspector.
    const url = new URL(window.location.href);
    if (id) url.searchParams.set('session', id);
    else url.searchParams.delete('session');
    window.history.replaceState(null, '', url);
  }

  async function fetchWithTimeout(path, options) {
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(), TURN_TIMEOUT_MS);
    try {
      return await fetch(path, { ...options, cache: 'no-store', signal: controller.signal });
    } finally {
      clearTimeout(timer);
    }
  }

  function showAttached() {
    ui.attached.textContent = state.files.map((file) => `📎 ${file.name}`).join(', ');
  }

  /** Uploads one file (POST /ai/files, then a PUT to the URL it answers); its file id, or an error text. */
  async function uploadFile(file, headers) {
    const opened = await fetchWithTimeout('/ai/files', {
      method: 'POST', headers,
      body: JSON.stringify({ name: file.name, contentType: file.type || 'application/octet-stream', size: file.size }),
    });
    const ticket = await opened.json().catch(() => null);
    if (!opened.ok || !ticket || !ticket.uploadUrl) {
      return { error: `Upload of ${file.name} refused (${opened.status}): ${(ticket && ticket.message) || ''}` };
    }
    const put = await fetchWithTimeout(ticket.uploadUrl, { method: 'PUT', headers: ticket.uploadHeaders, body: file });
    return put.ok ? { id: ticket.fileId } : { error: `Upload of ${file.name} failed (${put.status}).` };
  }

  async function sendTurn(text) {
    if (state.busy || (!text.trim() && !state.files.length)) return;
    if (!ui.flow.value) {
      setStatus('No flow to talk to: GET /ai/flows listed none.', true);
      return;
    }
    const payload = { flowName: ui.flow.value, message: text };
    if (!state.session) {
      const config = readConfig();
      ui.configError.hidden = config.ok;
      ui.configError.textContent = config.ok ? '' : config.error;
      if (!config.ok) return;
      if (config.value) payload.config = config.value;
    }
    const files = state.files;
    state.files = [];
    showAttached();
    ui.message.value = '';
    userTurn(files.length ? `${text}${text ? '\n' : ''}${files.map((file) => `📎 ${file.name}`).join('\n')}` : text);
    // One key per turn: a retry of this turn sends it again, so a turn that did commit is not run twice.
    await attemptTurn({ payload, files, key: crypto.randomUUID(), session: state.session });
  }

  /** The codes the API answers with Retry-After: the turn was not applied (or may have been) and may pass again. */
  const RETRYABLE = new Set([
    'SESSION_CONFLICT', 'SESSION_STORE_ERROR', 'FILE_STORE_ERROR', 'SESSION_OUTCOME_UNKNOWN', 'TURN_DEADLINE',
    'MODEL_UNAVAILABLE', 'MODEL_TIMEOUT', 'MODEL_THROTTLED', 'MCP_UNAVAILABLE',
  ]);

  /** Runs one attempt of ``turn``; a failure a retry may fix offers a Retry button that sends it again. */
  async function attemptTurn(turn) {
    setBusy(true);
    setStatus(turn.files.length ? 'Uploading…' : 'Waiting for the flow…');
    const pending = addToTranscript(el('li', { class: 'turn bot pending' }, el('div', { class: 'who' }, 'bot'), '…'));
    let completed = false;
    let retryable = false;
    try {
      const headers = { 'Content-Type': 'application/json' };
      if (turn.session) headers[SESSION_HEADER] = turn.session;
      const runHeaders = { ...headers, Accept: 'text/event-stream', 'Idempotency-Key': turn.key };
      if (!turn.payload.files && turn.files.length) {
        const uploads = [];
        for (const file of turn.files) uploads.push(await uploadFile(file, headers));
        const failed = uploads.find((upload) => upload.error);
        if (failed) throw new Error(failed.error);
        turn.payload.files = uploads.map((upload) => upload.id);
      }
      setStatus('Waiting for the flow…');
      const response = await fetchWithTimeout('/ai/run', {
        method: 'POST', headers: runHeaders, body: JSON.stringify(turn.payload),
      });
      let returned = response.headers.get(SESSION_HEADER);
      const contentType = response.headers.get('Content-Type') || '';
      if (contentType.startsWith('text/event-stream')) {
        const ended = await streamReply(response, pending);
        completed = ended.completed;
        retryable = ended.retryable;
        returned = ended.session || returned;
      } else if (contentType.startsWith('application/json')) {
        pending.remove();
        const body = await response.clone().json().catch(() => null);
        if (body && typeof body === 'object' && 'success' in body) {
          completed = showEnvelope(response.status, body);
          retryable = !body.success && RETRYABLE.has(body.code);
        } else {
          botTurn(contentType, await replyContent(response, contentType));
        }
      } else {
        pending.remove();
        // A step with its own content type answers with the raw message instead of the envelope.
        botTurn(contentType, await replyContent(response, contentType));
      }
      if (returned && SESSION_ID.test(returned)) {
        setSession(returned);
        showInspected(returned);
      }
      setStatus(response.ok ? '' : `HTTP ${response.status}`, !response.ok);
    } catch (error) {
      pending.remove();
      note(error.name === 'AbortError' ? 'No answer in time.' : `Could not send the turn: ${error.message}`, true);
      setStatus('Request failed', true);
      retryable = true;
    }
    if (retryable) offerRetry(turn);
    await finishTurn(completed);
    ui.message.focus();
  }

  // After a turn or a decision: a completed session is let go, the inspector and the turn count catch up.
  async function finishTurn(completed) {
    if (completed) {
      // The document stays readable, but the next message starts a new session (with the config again).
      note('Session completed. The next message starts a new session.');
      setSession(null);
    }
    await refreshInspector();
    state.turns += 1;
    document.body.dataset.turns = String(state.turns);
    setBusy(false);
  }

  /** A note with a Retry button that sends ``turn`` again with its own Idempotency-Key. */
  function offerRetry(turn) {
    const button = el('button', { type: 'button', class: 'retry' }, 'Retry');
    const item = note('', true);
    item.append(button);
    button.addEventListener('click', () => {
      if (state.busy) return;
      item.remove();
      attemptTurn(turn);
    });
  }

  /** The server-sent events of a streamed turn, each as soon as its blank line has arrived. */
  async function* serverEvents(response) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffered = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffered += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffered.indexOf('\n\n')) >= 0) {
        const frame = buffered.slice(0, end);
        buffered = buffered.slice(end + 2);
        let name = 'message';
        let data = '';
        for (const line of frame.split('\n')) {
          if (line.startsWith('event:')) name = line.slice(6).trim();
          else if (line.startsWith('data:')) data += line.slice(5).trim();
        }
        if (data) yield { name, data: JSON.parse(data) };
      }
    }
  }

  /** Marks a streamed bubble's text as not part of the reply (taken back, or its turn aborted). */
  function discard(bubble, why) {
    bubble.classList.remove('streaming');
    bubble.classList.add('discarded');
    bubble.querySelector('.who').textContent = `bot · ${why}`;
  }

  /** Shows a streamed turn as it arrives, in ``pending``'s place; returns the session and whether it completed. */
  async function streamReply(response, pending) {
    let live = null;
    let final = null;
    pending.remove();
    for await (const event of serverEvents(response)) {
      if (event.name === 'delta') {
        if (!live) {
          live = botTurn('text/plain', el('div', { class: 'text' }));
          live.classList.add('streaming');
        }
        live.querySelector('.text').append(event.data.text);
        ui.transcript.scrollTop = ui.transcript.scrollHeight;
        setStatus('The flow is answering…');
      } else if (event.name === 'reset') {
        if (live) discard(live, 'discarded');
        live = null;
      } else if (event.name === 'step' || event.name === 'tool') {
        setStatus(`${event.name === 'tool' ? 'Calling' : 'Entering'} ${event.data.name}…`);
      } else if (event.name === 'committed' || event.name === 'aborted') {
        final = event;
        break;
      }
    }
    if (!final) {
      if (live) discard(live, 'not kept');
      note('The stream ended before the turn did.', true);
      return { session: null, completed: false, retryable: true, committed: false, code: null };
    }
    const body = final.data;
    let completed = false;
    if (final.name === 'aborted') {
      if (live) discard(live, 'not kept');
      completed = showEnvelope(200, body);
    } else if (live && typeof body.message === 'string' && (body.contentType || 'text/plain') === 'text/plain') {
      // The streamed words are the committed reply: shown again as markdown, now that it is whole.
      live.classList.remove('streaming');
      live.querySelector('.text').replaceWith(renderMarkdown(body.message));
      completed = Boolean(body.completed);
      showPendingApprovals(body);
    } else {
      if (live) discard(live, 'discarded');
      completed = showEnvelope(200, body);
    }
    const committed = final.name === 'committed' && body.success !== false;
    return {
      session: body.session, completed, committed, code: body.code || null,
      retryable: final.name === 'aborted' && RETRYABLE.has(body.code),
    };
  }

  /** Shows a JSON envelope; returns whether the flow completed. */
  function showEnvelope(status, body) {
    if (!body.success) {
      const text = typeof body.message === 'string' ? body.message : JSON.stringify(body.message);
      note(`${status === 200 ? 'Aborted' : `Error ${status}`} ${body.code || ''}: ${text}`, true);
      return false;
    }
    const contentType = body.contentType || 'text/plain';
    // A streamed turn's envelope carries a reply of any content type as text; a JSON answer's is plain text.
    const type = contentType.split(';')[0].trim().toLowerCase();
    const content = typeof body.message === 'string' ? textReply(type, body.message) : jsonBlock(body.message);
    botTurn(contentType, content);
    showPendingApprovals(body);
    return Boolean(body.completed);
  }

  // -- tool calls waiting for a decision ----------------------------------------------------------------
  // A turn whose envelope lists `pendingApprovals` paused those tool calls until a person decides. A call the
  // user decides gets a card: what the tool does, the exact arguments it will run with (the server runs the
  // stored ones, whatever a client sends), and Approve / Deny. The decision is a turn of its own: POST /ai/run
  // with `approvals` and no message, whose reply is the model's answer. A call a reviewer decides is shown as
  // waiting, without buttons. Cards follow the stored document: once a call is decided (here or by a reviewer)
  // or has expired, its card says so and its buttons stay disabled.

  /** Approval id -> its card in the transcript. */
  const approvalCards = new Map();
  /** The descriptions of the flows' tools, `{flow: {tool: description}}`, fetched once (GET /ai/tools). */
  let toolCatalog = null;

  function toolDescriptions() {
    if (!toolCatalog) {
      toolCatalog = fetch('/ai/tools', { cache: 'no-store' })
        .then((response) => (response.ok ? response.json() : {}))
        .catch(() => ({}));
    }
    return toolCatalog;
  }

  /** Fills `node` with what `tool` of `flow` does, once the descriptions are in (a batch "a+b" gets each). */
  function describeTool(node, flow, tool) {
    toolDescriptions().then((catalog) => {
      const known = (catalog && catalog[flow]) || {};
      const text = String(tool).split('+').map((name) => known[name]).filter(Boolean).join(' ');
      node.textContent = text;
      node.hidden = !text;
    });
  }

  /** The pending calls of a stored document, in the envelope's form. */
  function pendingInDocument(doc) {
    return (doc.approvals || []).filter((approval) => approval.status === 'pending').map((approval) => ({
      id: approval.id, ...approvalCall(approval), step: approval.step, approver: approval.approver,
      expiresAt: approval.expiresAt,
    }));
  }

  /** A stored approval's tool and arguments, named as the envelope names them ("a+b" and a list for a batch). */
  function approvalCall(approval) {
    const calls = approval.calls || [];
    if (approval.group) {
      return { tool: calls.map((call) => call.name).join('+'),
        arguments: calls.map((call) => ({ tool: call.name, arguments: call.args })) };
    }
    return { tool: (calls[0] && calls[0].name) || '?', arguments: (calls[0] && calls[0].args) ?? {} };
  }

  /** Adds a card for each newly listed call; a card whose call the envelope no longer lists stops waiting. */
  function showPendingApprovals(body) {
    const items = Array.isArray(body.pendingApprovals) ? body.pendingApprovals : [];
    const listed = new Set(items.map((item) => item && item.id));
    for (const [id, card] of approvalCards) {
      if (['pending', 'waiting'].includes(card.dataset.state) && !listed.has(id)) {
        setCardState(card, 'decided', 'No longer waiting for a decision.');
      }
    }
    for (const item of items) {
      if (item && item.id && !approvalCards.has(item.id)) approvalCards.set(item.id, addToTranscript(approvalCard(item)));
    }
  }

  function approvalCard(item) {
    const reviewer = item.approver === 'reviewer';
    const description = el('p', { class: 'tool-description', hidden: true });
    describeTool(description, ui.flow.value, item.tool);
    const card = el('li', {
      class: 'approval', 'data-approval-id': item.id, 'data-approver': item.approver,
      'data-state': reviewer ? 'waiting' : 'pending',
    },
    el('div', { class: 'who' }, reviewer ? 'waiting for a reviewer' : 'your decision is needed'),
    el('div', { class: 'call-head' }, el('span', { class: 'badge tool' }, 'tool call'),
      el('strong', { class: 'tool-name' }, item.tool)),
    description,
    jsonBlock(item.arguments ?? {}, 'args'),
    el('p', { class: 'hint expires' }, `Waits until ${item.expiresAt}; undecided by then, it counts as declined.`),
    el('p', { class: 'outcome', role: 'status' }, reviewer
      ? 'Waiting for a reviewer: a colleague decides this call, and its result reaches you on a later turn.' : ''));
    if (!reviewer) {
      const reason = el('input', { class: 'reason', type: 'text', maxlength: 500, 'aria-label': 'Reason for denying',
        placeholder: 'Reason (optional, sent with Deny)' });
      const approve = el('button', { type: 'button', class: 'approve' }, 'Approve');
      const deny = el('button', { type: 'button', class: 'deny' }, 'Deny');
      approve.addEventListener('click', () => decideApproval(card, item, true));
      deny.addEventListener('click', () => decideApproval(card, item, false));
      card.append(el('div', { class: 'decide' }, reason, approve, deny));
    }
    return card;
  }

  /** `pending` (buttons live), `sending`, `waiting` (a reviewer's) or `decided` (buttons off for good). */
  function setCardState(card, cardState, text, outcome) {
    card.dataset.state = cardState;
    if (outcome) card.dataset.outcome = outcome;
    for (const control of card.querySelectorAll('.decide button, .decide input')) {
      control.disabled = cardState !== 'pending';
    }
    card.querySelector('.outcome').textContent = text;
  }

  /** Once the stored document has decided a carded call, the card says how (and by whom). */
  function syncApprovalCards(doc) {
    for (const approval of doc.approvals || []) {
      const card = approvalCards.get(approval.id);
      if (!card || approval.status === 'pending' || card.dataset.state === 'sending') continue;
      setCardState(card, 'decided', approvalOutcome(approval), approval.status);
    }
  }

  function approvalOutcome(approval) {
    const by = approval.decidedBy ? ` by ${approval.decidedBy}` : '';
    const reason = approval.reason ? ` Reason: ${approval.reason}` : '';
    if (approval.status === 'approved') return `Approved${by}: the call ran with these arguments.`;
    if (approval.status === 'denied') return `Denied${by}: the call did not run.${reason}`;
    return 'Expired: no decision came in time, so the call was declined and did not run.';
  }

  // A refusal that decides nothing yet ends the card's chance: the call is not (or not the user's) to decide.
  const FINAL_REFUSALS = ['APPROVAL_NOT_PENDING', 'NOT_APPROVER'];

  /** Sends the user's decision on one call and shows the model's answer. */
  async function decideApproval(card, item, approved) {
    if (state.busy || card.dataset.state !== 'pending' || !state.session) return;
    const reason = approved ? '' : card.querySelector('input.reason').value.trim();
    const decision = { id: item.id, approved };
    if (reason) decision.reason = reason;
    setCardState(card, 'sending', approved ? 'Sending your approval…' : 'Sending your refusal…');
    userTurn(approved ? `Approved ${item.tool}` : `Denied ${item.tool}${reason ? `: ${reason}` : ''}`);
    setBusy(true);
    setStatus('Sending the decision…');
    const pending = addToTranscript(el('li', { class: 'turn bot pending' }, el('div', { class: 'who' }, 'bot'), '…'));
    let outcome = { committed: false, code: null, completed: false };
    try {
      const response = await fetchWithTimeout('/ai/run', {
        method: 'POST',
        headers: {
          'Content-Type': 'application/json', Accept: 'text/event-stream', [SESSION_HEADER]: state.session,
          'Idempotency-Key': crypto.randomUUID(),
        },
        body: JSON.stringify({ flowName: ui.flow.value, approvals: [decision] }),
      });
      outcome = await decisionReply(response, pending);
      setStatus(outcome.committed ? '' : 'The decision was not applied.', !outcome.committed);
    } catch (error) {
      pending.remove();
      note(error.name === 'AbortError' ? 'No answer in time.' : `Could not send the decision: ${error.message}`, true);
      setStatus('Request failed', true);
    }
    if (outcome.committed) {
      setCardState(card, 'decided', approved ? 'Approved.' : `Denied.${reason ? ` Reason: ${reason}` : ''}`,
        approved ? 'approved' : 'denied');
    } else if (FINAL_REFUSALS.includes(outcome.code)) {
      setCardState(card, 'decided', 'This call is no longer waiting for your decision.', 'refused');
    } else {
      setCardState(card, 'pending', 'The decision was not applied; you can decide again.');
    }
    await finishTurn(outcome.completed);
  }

  /** Shows the answer to a decision (a stream or a JSON envelope); whether it committed, and its failure code. */
  async function decisionReply(response, pending) {
    const contentType = response.headers.get('Content-Type') || '';
    if (contentType.startsWith('text/event-stream')) return streamReply(response, pending);
    pending.remove();
    const body = await response.clone().json().catch(() => null);
    if (!body || typeof body !== 'object' || !('success' in body)) {
      botTurn(contentType, await replyContent(response, contentType));
      return { committed: response.ok, code: null, completed: false };
    }
    const completed = showEnvelope(response.status, body);
    return { committed: Boolean(body.success), code: body.code || null, completed };
  }

  async function newChat() {
    if (state.busy) return;
    const ending = state.session;
    if (ending) {
      setBusy(true);
      try {
        const response = await fetchWithTimeout('/ai/end', { method: 'POST', headers: { [SESSION_HEADER]: ending } });
        const body = await response.json().catch(() => ({}));
        if (!response.ok) setStatus(`Could not end the session: ${body.message || response.status}`, true);
      } catch (error) {
        setStatus(`Could not end the session: ${error.message}`, true);
      }
      setBusy(false);
    }
    setSession(null);
    showInspected(null);
    ui.transcript.replaceChildren();
    approvalCards.clear();
    clearInspector();
    if (ending) setStatus('Session ended.');
    ui.message.focus();
  }

  async function loadFlows(preferred) {
    try {
      const response = await fetch('/ai/flows', { cache: 'no-store' });
      const names = await response.json();
      ui.flow.replaceChildren(...names.map((name) => el('option', { value: name }, name)));
      if (preferred && names.includes(preferred)) ui.flow.value = preferred;
      if (!names.length) setStatus('No flows are registered (PICOFLOW_FLOWS).', true);
    } catch (error) {
      setStatus(`Could not list the flows: ${error.message}`, true);
    }
  }

  // -- the inspector ----------------------------------------------------------------------------------

  function clearInspector() {
    state.doc = null;
    ui.body.hidden = true;
    ui.empty.hidden = false;
    ui.empty.textContent = 'No session yet. Send a message to start one.';
  }

  async function refreshInspector() {
    const id = state.inspected;
    if (!id) return;
    try {
      const response = await fetch('/ai/session', { headers: { [SESSION_HEADER]: id }, cache: 'no-store' });
      if (id !== state.inspected) return; // a newer session took over meanwhile
      if (!response.ok) {
        const body = await response.json().catch(() => ({}));
        ui.body.hidden = true;
        ui.empty.hidden = false;
        ui.empty.textContent = response.status === 404
          ? `Session ${id} is not stored (it was ended, or never existed).`
          : `Could not read session ${id}: ${body.message || response.status}`;
        return;
      }
      renderInspector(await response.json());
    } catch (error) {
      setStatus(`Could not read the session: ${error.message}`, true);
    }
  }

  /** A collapsible part; once the reader opened or closed it, refreshes keep it that way. */
  function collapsible(key, summary, open, ...content) {
    const attrs = { 'data-key': key, open: state.toggled.get(key) ?? open };
    return el('details', attrs, el('summary', {}, ...summary), ...content);
  }

  function renderInspector(doc) {
    state.doc = doc;
    ui.empty.hidden = true;
    ui.body.hidden = false;
    const flow = doc.flow || {};
    renderHead(doc, flow);
    renderDiagram(flow);
    renderPath(flow);
    renderStates(flow);
    renderMemory(flow.memory || {}, effectMarks(doc));
    renderTokens(doc.tokens || {}, doc.decisionUsage);
    renderApprovals(doc);
    syncApprovalCards(doc);
    renderLogs(doc);
    ui.rawBody.replaceChildren();
    if (ui.raw.open) ui.rawBody.append(jsonBlock(doc));
  }

  function renderHead(doc, flow) {
    const fact = (name, value, className) => [el('dt', {}, name), el('dd', { class: className }, value)];
    const model = flow.model ? `${flow.model.provider} / ${flow.model.name}` : '—';
    ui.head.replaceChildren(
      ...fact('Flow', flow.name || '—'),
      ...fact('Session', doc.id, 'mono'),
      ...fact('Status', doc.runStatus, `run-${doc.runStatus}`),
      ...fact('Current step', flow.currentStep || '—', 'current-step'),
      ...fact('Revision', String(doc.revision), 'revision'),
      ...fact('Model', model),
      ...fact('Created', doc.createdOn || '—'),
      ...fact('Saved', doc.saveOn || '—'),
    );
  }

  // The diagram: one box per step (in the flow's order), the current one highlighted, visited ones solid.
  // Arcs on the right are the moves between top-level steps in `sequence` (×n when taken more than once);
  // dashed arcs on the left are nested runs (a parent step running a child), and nested steps are indented.
  function renderDiagram(flow) {
    const sequence = flow.sequence || [];
    const names = (flow.steps || []).map((step) => step.name);
    for (const item of sequence) if (!names.includes(item.stepName)) names.push(item.stepName);
    const row = new Map(names.map((name, index) => [name, index]));
    const visits = new Map();
    const depth = new Map();
    for (const item of sequence) {
      visits.set(item.stepName, (visits.get(item.stepName) || 0) + 1);
      depth.set(item.stepName, Math.min(depth.get(item.stepName) ?? item.level, item.level));
    }
    const moves = new Map();
    const calls = new Map();
    const stack = []; // the latest entry seen at each level
    let previousTop = null;
    for (const item of sequence) {
      stack[item.level] = item.stepName;
      stack.length = item.level + 1;
      const parent = item.level > 1 ? stack[item.level - 1] : null;
      if (item.level === 1) {
        if (previousTop !== null && previousTop !== item.stepName) bump(moves, [previousTop, item.stepName]);
        previousTop = item.stepName;
      } else if (parent) {
        bump(calls, [parent, item.stepName]);
      }
    }

    const BOX_H = 26, GAP = 12, INDENT = 18, LEFT = 46, PAD = 8;
    const maxIndent = Math.max(0, ...[...depth.values()].map((level) => level - 1)) * INDENT;
    const width = Math.max(160, ...names.map((name) => name.length * 7.2 + 56));
    const right = LEFT + maxIndent + width;
    const spanOf = (key) => { const [a, b] = JSON.parse(key); return Math.abs(row.get(a) - row.get(b)); };
    const widest = Math.max(0, ...[...moves.keys()].map(spanOf));
    const height = names.length * (BOX_H + GAP) + GAP;
    const totalWidth = right + 40 + widest * 10 + 40;
    const yOf = (name) => GAP + row.get(name) * (BOX_H + GAP) + BOX_H / 2;
    const xOf = (name) => LEFT + ((depth.get(name) || 1) - 1) * INDENT;

    const arrow = (id) => svg('marker',
      { id, viewBox: '0 0 8 8', refX: 7, refY: 4, markerWidth: 7, markerHeight: 7, orient: 'auto-start-reverse' },
      svg('path', { d: 'M0,0 L8,4 L0,8 z', class: `arrow-${id}` }));
    const picture = svg('svg',
      { width: totalWidth, height, viewBox: `0 0 ${totalWidth} ${height}`, role: 'img', 'aria-label': 'Flow steps' },
      svg('defs', {}, arrow('move'), arrow('call')));

    for (const [key, count] of moves) {
      const [from, to] = JSON.parse(key);
      const y1 = yOf(from), y2 = yOf(to);
      const bend = 24 + spanOf(key) * 10;
      const shift = y2 > y1 ? -3 : 3; // the two directions between the same pair do not overlap
      const [from1, to1] = [y1 + shift, y2 - shift];
      const path = svg('path', {
        class: y2 > y1 ? 'move down' : 'move up',
        'marker-end': 'url(#move)',
        d: `M${right},${from1} C${right + bend},${from1} ${right + bend},${to1} ${right + 2},${to1}`,
      });
      path.append(svg('title', {}, `${from} → ${to}${count > 1 ? ` (${count} times)` : ''}`));
      picture.append(path);
      if (count > 1) {
        const at = { class: 'move-count', x: right + bend * 0.75 + 4, y: (y1 + y2) / 2 + 4 };
        picture.append(svg('text', at, `×${count}`));
      }
    }
    for (const [key] of calls) {
      const [parent, child] = JSON.parse(key);
      const x1 = xOf(parent), x2 = xOf(child), y1 = yOf(parent), y2 = yOf(child);
      const bend = 14 + Math.abs(row.get(parent) - row.get(child)) * 4;
      const path = svg('path', { class: 'call', 'marker-end': 'url(#call)',
        d: `M${x1},${y1} C${x1 - bend},${y1} ${x2 - bend},${y2} ${x2 - 2},${y2}` });
      path.append(svg('title', {}, `${parent} runs ${child}`));
      picture.append(path);
    }
    for (const name of names) {
      const x = xOf(name), y = yOf(name) - BOX_H / 2;
      const count = visits.get(name) || 0;
      const classes = ['node', count ? 'visited' : 'unvisited'];
      if (name === flow.currentStep) classes.push('current');
      const group = svg('g', { class: classes.join(' '), 'data-step': name },
        svg('rect', { x, y, width: right - x, height: BOX_H, rx: 5 }),
        svg('text', { x: x + PAD, y: y + BOX_H / 2 + 4, class: 'name' }, name),
        svg('text', { x: right - PAD, y: y + BOX_H / 2 + 4, class: 'visits', 'text-anchor': 'end' },
          count ? `×${count}` : ''),
        svg('title', {}, `${name}: ${count} entr${count === 1 ? 'y' : 'ies'} in the path` +
          (name === flow.currentStep ? ' (current step)' : '')));
      picture.append(group);
    }
    ui.diagram.replaceChildren(picture);
  }

  /** Counts a pair of step names (kept as a JSON key, whatever characters the names hold). */
  function bump(map, pair) {
    const key = JSON.stringify(pair);
    map.set(key, (map.get(key) || 0) + 1);
  }

  function renderPath(flow) {
    const sequence = flow.sequence || [];
    let lastTop = -1;
    sequence.forEach((item, index) => { if (item.level === 1) lastTop = index; });
    ui.path.replaceChildren(...sequence.map((item, index) => {
      const entry = el('li', { class: `level-${Math.min(item.level, 6)}`, 'data-level': item.level },
        item.level > 1 ? el('span', { class: 'badge' }, `L${item.level}`) : null,
        el('span', { class: 'step' }, item.stepName),
        index === lastTop && item.stepName === flow.currentStep
          ? el('span', { class: 'badge current' }, 'current') : null);
      // Indentation through the CSS object model: the page's policy refuses style attributes.
      entry.style.marginLeft = `${(item.level - 1) * 1.25}rem`;
      return entry;
    }));
  }

  function renderStates(flow) {
    const steps = flow.steps || [];
    const parts = steps.map((step) => {
      const stored = step.state || {};
      const keys = Object.keys(stored);
      const current = step.name === flow.currentStep;
      const summary = [
        el('span', { class: 'step' }, step.name),
        current ? el('span', { class: 'badge current' }, 'current') : null,
        el('span', { class: 'hint' }, keys.length ? `${keys.length} key${keys.length === 1 ? '' : 's'}` : 'empty'),
        // A step may run on another model than the flow's.
        step.model ? el('span', { class: 'hint' }, `model ${step.model.provider} / ${step.model.name}`) : null,
      ];
      return collapsible(`state:${step.name}`, summary, current && keys.length > 0, jsonBlock(stored));
    });
    const contextSummary = [el('span', { class: 'step' }, 'Flow context'),
      el('span', { class: 'hint' }, 'flow.context, with the config')];
    parts.push(collapsible('state:context', contextSummary, false, jsonBlock(flow.context || {})));
    ui.states.replaceChildren(...parts);
  }

  function contentNode(content) {
    // Stored text is shown as it is (not as markdown): the inspector shows what the model saw.
    if (typeof content !== 'string') return jsonBlock(content, 'content'); // e.g. a list of content parts
    return content ? el('div', { class: 'content' }, content) : el('div', { class: 'content empty' }, '(no text)');
  }

  // What the log says of effect tool calls: run and journaled, or replayed from the journal by a retried turn.
  const EFFECT_LOG = { 'effect journaled': 'journaled', 'effect replayed': 'replayed' };

  /** Tool call id -> 'journaled' or 'replayed', from the session log's effect entries. */
  function effectMarks(doc) {
    const marks = new Map();
    for (const entry of doc.log || []) {
      const mark = EFFECT_LOG[entry.message];
      if (!mark) continue;
      for (const id of entry.toolCallIds || []) marks.set(id, mark);
    }
    return marks;
  }

  function effectBadge(mark) {
    if (mark === 'replayed') {
      return el('span', { class: 'badge effect replayed', title: 'A retry of the turn replayed the journaled outcome; '
        + 'the handler did not run again.' }, 'effect · replayed');
    }
    return el('span', { class: 'badge effect', title: 'An effect tool: its outcome was journaled, so a retry of the '
      + 'turn replays it instead of running the handler again.' }, 'effect · journaled');
  }

  function renderMemory(memory, marks) {
    const names = Object.keys(memory);
    if (!names.length) {
      ui.memory.replaceChildren(el('p', { class: 'empty' }, 'No memory namespaces yet.'));
      return;
    }
    const latest = latestNamespace(memory);
    ui.memory.replaceChildren(...names.map((name) => {
      const space = memory[name] || {};
      const messages = space.messages || [];
      // Tool results are shown under the call that asked for them; their own entry points back to it.
      const results = new Map();
      messages.forEach((message, index) => {
        if (message.type === 'tool') results.set(message.tool_call_id, { message, index });
      });
      const callers = new Map();
      messages.forEach((message, index) => {
        for (const call of message.tool_calls || []) if (call.id && results.has(call.id)) callers.set(call.id, index);
      });
      const body = [];
      if (space.summary) {
        const through = space.summarizedThroughId
          ? el('span', { class: 'hint mono' }, `through ${space.summarizedThroughId}`) : null;
        body.push(el('div', { class: 'summary' },
          el('div', { class: 'label' }, 'Rolling summary', through),
          el('div', { class: 'content' }, space.summary)));
      }
      const items = messages.map((message, index) => messageNode(message, index, results, callers, marks));
      body.push(el('ol', { class: 'messages', start: 0 }, ...items));
      const summary = [
        el('span', { class: 'ns-name' }, name),
        el('span', { class: 'hint' }, `${messages.length} message${messages.length === 1 ? '' : 's'}`),
        space.summary ? el('span', { class: 'badge summary-badge' }, 'summary') : null,
      ];
      const part = collapsible(`ns:${name}`, summary, name === latest, ...body);
      part.dataset.ns = name;
      return part;
    }));
  }

  /** The namespace written last (ISO timestamps sort as text): the one opened when nothing says otherwise. */
  function latestNamespace(memory) {
    let latest = null;
    let when = '';
    for (const [name, space] of Object.entries(memory)) {
      for (const message of (space && space.messages) || []) {
        if ((message.timestamp || '') >= when) {
          when = message.timestamp || '';
          latest = name;
        }
      }
    }
    return latest;
  }

  function messageNode(message, index, results, callers, marks) {
    const kind = message.type;
    const head = el('div', { class: 'msg-head' },
      el('span', { class: 'index' }, `#${index}`), el('span', { class: `type type-${kind}` }, kind));
    // Index 0 is the slot the step's system prompt is rewritten into on every turn.
    if (index === 0 && kind === 'system') head.append(el('span', { class: 'badge' }, 'system slot'));
    // A direct reply was written by the step's code, not generated by the model.
    if (message.additional_kwargs && message.additional_kwargs.direct) {
      head.append(el('span', { class: 'badge' }, 'direct reply'));
    }
    if (message.timestamp) head.append(el('span', { class: 'hint' }, message.timestamp));
    const item = el('li', { class: `msg msg-${kind}` }, head);
    if (kind === 'system') {
      // System prompts are long: the first line, and the rest on demand.
      const text = typeof message.content === 'string' ? message.content : JSON.stringify(message.content);
      const firstLine = text.split('\n').find((line) => line.trim()) || '(empty)';
      item.append(el('details', {}, el('summary', {}, firstLine), contentNode(message.content)));
    } else if (kind === 'tool') {
      const caller = callers.get(message.tool_call_id);
      const what = `result of ${message.name || 'a tool'} (${message.tool_call_id})`;
      if (caller !== undefined) {
        item.classList.add('paired');
        item.append(el('div', { class: 'hint' }, `${what}, shown under #${caller}`));
      } else {
        // E.g. compaction dropped the call but kept its result.
        item.append(el('div', { class: 'hint' }, `${what}; its call is not in this memory`));
        item.append(contentNode(message.content));
      }
    } else if (message.content !== '' || !(message.tool_calls || []).length) {
      item.append(contentNode(message.content));
    }
    for (const call of message.tool_calls || []) {
      const result = results.get(call.id);
      const callHead = el('div', { class: 'call-head' },
        el('span', { class: 'badge tool' }, 'tool call'), el('strong', {}, call.name),
        el('span', { class: 'hint mono' }, call.id || ''));
      if (call.id && marks.has(call.id)) callHead.append(effectBadge(marks.get(call.id)));
      let outcome = el('div', { class: 'result missing hint' }, 'no result in this memory');
      if (result) {
        const status = result.message.status || '';
        outcome = el('div', { class: `result status-${status || 'success'}` },
          el('div', { class: 'call-head' },
            el('span', { class: 'badge' }, `result #${result.index}`), el('span', { class: 'hint' }, status)),
          contentNode(result.message.content));
      }
      item.append(el('div', { class: 'call' }, callHead, jsonBlock(call.args || {}, 'args'), outcome));
    }
    return item;
  }

  /** The session's approvals: each call a person decides, pending or decided, with who, when and why. */
  function renderApprovals(doc) {
    const approvals = doc.approvals || [];
    if (!approvals.length) {
      ui.approvals.replaceChildren(el('p', { class: 'empty' }, 'No tool call has waited for a decision.'));
      return;
    }
    const flowName = (doc.flow && doc.flow.name) || '';
    ui.approvals.replaceChildren(el('ol', { class: 'approval-list' }, ...approvals.map((approval) => {
      const { tool, arguments: args } = approvalCall(approval);
      const description = el('div', { class: 'hint tool-description', hidden: true });
      describeTool(description, flowName, tool);
      const decider = approval.approver === 'reviewer' ? 'a reviewer' : 'the user';
      let decidedBy = '—';
      if (approval.status === 'expired') decidedBy = 'nobody (expired)';
      else if (approval.status !== 'pending') decidedBy = approval.decidedBy || decider;
      const fact = (name, key, value) => [el('dt', {}, name), el('dd', { 'data-fact': key }, value || '—')];
      return el('li', { class: `approval-entry status-${approval.status}`, 'data-approval-id': approval.id,
        'data-status': approval.status },
      el('div', { class: 'call-head' }, el('strong', { class: 'tool-name' }, tool),
        el('span', { class: `badge approval-status status-${approval.status}` }, approval.status),
        el('span', { class: 'hint mono' }, approval.id)),
      description,
      el('dl', { class: 'facts' },
        ...fact('Decided by', 'decidedBy', decidedBy),
        ...fact('Approver', 'approver', decider),
        ...fact('Decided at', 'decidedAt', approval.decidedAt),
        ...fact('Reason', 'reason', approval.reason),
        ...fact('Created', 'createdAt', approval.createdAt),
        ...fact('Expires', 'expiresAt', approval.expiresAt),
        ...fact('Step', 'step', approval.step),
        // Settled: the model has read the outcome (the tool's result, or that it was declined).
        ...fact('Outcome delivered', 'settled', approval.settled ? 'yes' : 'not yet')),
      jsonBlock(args, 'args'));
    })));
  }

  const TOKEN_ROWS = [
    ['inputTokens', 'Input', 0],
    ['cachedInputTokens', 'cached (read from the cache)', 1],
    ['cacheCreationInputTokens', 'written to the cache', 1],
    ['outputTokens', 'Output', 0],
    ['visibleOutputTokens', 'visible', 1],
    ['reasoningTokens', 'reasoning', 1],
    ['totalTokens', 'Total', 0],
  ];

  function renderTokens(tokens, decisions) {
    const format = (value) => (Number(value) || 0).toLocaleString('en-US');
    // DecisionStep calls are counted apart from the chat model's (decisionUsage), when there were any.
    const head = el('tr', {},
      el('th', {}, ''), el('th', {}, 'Chat model'), decisions ? el('th', {}, 'Decisions') : null);
    const rows = TOKEN_ROWS.map(([field, label, sub]) => el('tr', { class: sub ? 'sub' : 'main' },
      el('th', { scope: 'row' }, sub ? `of which ${label}` : label),
      el('td', { 'data-token': field }, format(tokens[field])),
      decisions ? el('td', { 'data-decision-token': field }, format(decisions[field])) : null));
    if (decisions) {
      // Decision usage also counts the provider's responses; chat calls are not counted.
      rows.push(el('tr', { class: 'main' }, el('th', { scope: 'row' }, 'Calls'), el('td', {}, '–'),
        el('td', { 'data-decision-token': 'calls' }, format(decisions.calls))));
    }
    // One bar for the input/output split of the total, so the cost's shape is visible at a glance.
    const total = Number(tokens.totalTokens) || 0;
    const bar = el('div', { class: 'token-bar', title: 'input / output share of the total' });
    if (total > 0) {
      const input = el('span', { class: 'in' });
      const output = el('span', { class: 'out' });
      input.style.width = `${(100 * (Number(tokens.inputTokens) || 0)) / total}%`;
      output.style.width = `${(100 * (Number(tokens.outputTokens) || 0)) / total}%`;
      bar.append(input, output);
    }
    ui.tokens.replaceChildren(el('table', { class: 'tokens' }, el('thead', {}, head), el('tbody', {}, ...rows)), bar);
  }

  function renderLogs(doc) {
    const kinds = ['error', 'warn', 'log', 'debug', 'verbose'];
    ui.logs.replaceChildren(...kinds
      .filter((kind) => ['error', 'warn', 'log'].includes(kind) || (doc[kind] || []).length)
      .map((kind) => {
        const entries = doc[kind] || [];
        const list = entries.length
          ? el('ol', { class: 'log-entries' }, ...entries.map((entry) => {
            const { timestamp, level, message, ...extra } = entry;
            return el('li', { class: `log-${kind}` }, el('span', { class: 'hint mono' }, timestamp || ''), ' ',
              el('span', { class: 'badge' }, level || kind), ' ', el('span', { class: 'content' }, message ?? ''),
              Object.keys(extra).length ? jsonBlock(extra, 'extra') : null);
          }))
          : el('p', { class: 'empty' }, 'none');
        const summary = [el('span', { class: `log-kind log-${kind}` }, kind),
          el('span', { class: 'hint' }, String(entries.length))];
        return collapsible(`log:${kind}`, summary, entries.length > 0, list);
      }));
  }

  // -- start ------------------------------------------------------------------------------------------

  async function openSession(id) {
    showInspected(id);
    const request = { headers: { [SESSION_HEADER]: id }, cache: 'no-store' };
    const response = await fetch('/ai/session', request).catch(() => null);
    if (!response || !response.ok) {
      await refreshInspector(); // explains the failure in the inspector
      return;
    }
    const doc = await response.json();
    const name = doc.flow && doc.flow.name;
    // The flow may no longer be registered; its name is still what the session belongs to.
    if (name && ![...ui.flow.options].some((option) => option.value === name)) {
      ui.flow.append(el('option', { value: name }, name));
    }
    if (name) ui.flow.value = name;
    // A running session can be continued from here; a finished one is only inspected.
    setSession(doc.runStatus === 'running' ? id : null);
    note(`Opened session ${id} (${name}, ${doc.runStatus}). Its messages are in the inspector's Memory panel.`);
    renderInspector(doc);
    if (doc.runStatus === 'running') showPendingApprovals({ pendingApprovals: pendingInDocument(doc) });
  }

  ui.composer.addEventListener('submit', (event) => {
    event.preventDefault();
    sendTurn(ui.message.value);
  });
  ui.message.addEventListener('keydown', (event) => {
    // Enter sends; Shift+Enter is a new line; Enter that confirms an input-method composition is left alone.
    if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      sendTurn(ui.message.value);
    }
  });
  ui.attach.addEventListener('click', () => ui.attachInput.click());
  ui.attachInput.addEventListener('change', () => {
    state.files = [...ui.attachInput.files];
    ui.attachInput.value = '';
    showAttached();
  });
  ui.newChat.addEventListener('click', newChat);
  ui.refresh.addEventListener('click', refreshInspector);
  // A click on a summary (the keyboard's Enter and Space click too) is the reader's choice, remembered
  // across refreshes; the parts' defaults (e.g. the namespace written last) follow the session otherwise.
  ui.body.addEventListener('click', (event) => {
    const summary = event.target.closest('summary');
    const part = summary && summary.parentElement;
    if (part && part.dataset.key && !event.defaultPrevented) state.toggled.set(part.dataset.key, !part.open);
  });
  // The raw document can be large: it is only printed while its panel is open.
  ui.raw.addEventListener('toggle', () => {
    ui.rawBody.replaceChildren();
    if (ui.raw.open && state.doc) ui.rawBody.append(jsonBlock(state.doc));
  });

  (async () => {
    const params = new URLSearchParams(window.location.search);
    await loadFlows(params.get('flow'));
    const requested = params.get('session');
    if (requested && SESSION_ID.test(requested)) await openSession(requested);
    else clearInspector();
    lockSessionControls();
    document.body.dataset.ready = 'true';
    ui.message.focus();
  })();
})();

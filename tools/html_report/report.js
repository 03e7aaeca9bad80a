/* report.js: draws a tensorpool report from the JSON in <script id="report-data"> (its layout is
 * described in tools/html_report_page.cpp). Plain DOM and SVG, no library, nothing fetched.
 * Each panel is drawn by its own function from its part of the data; a panel that fails shows
 * its error in #errors and the others are still drawn. When done, body[data-rendered] is "ok"
 * (or "error"), body[data-render-ms] the time the drawing took and body[data-open-ms] the time
 * since the navigation started (reading the file, parsing the page and its data, drawing), for
 * tests and for the curious. */
(function () {
  'use strict';
  const started = performance.now();
  const SVG = 'http://www.w3.org/2000/svg';
  const data = JSON.parse(document.getElementById('report-data').textContent);
  const failures = [];

  // ---- small helpers -----------------------------------------------------------------------
  function h(tag, attrs, children) {
    const e = document.createElement(tag);
    for (const k in attrs || {}) {
      if (k === 'text') e.textContent = attrs[k];
      else if (k === 'cls') e.className = attrs[k];
      else e.setAttribute(k, attrs[k]);
    }
    for (const c of children || []) if (c !== null && c !== undefined) e.append(c);
    return e;
  }
  function s(tag, attrs, parent) {
    const e = document.createElementNS(SVG, tag);
    for (const k in attrs || {}) {
      if (k === 'text') e.textContent = attrs[k];
      else e.setAttribute(k, attrs[k]);
    }
    if (parent) parent.appendChild(e);
    return e;
  }
  function tip(node, text) { s('title', { text: text }, node); return node; }
  const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  function bytes(n) {
    if (n === null || n === undefined) return '-';
    let u = 0;
    let v = Math.abs(n);
    while (v >= 1024 && u < UNITS.length - 1) { v /= 1024; u++; }
    const digits = u === 0 ? 0 : v >= 100 ? 1 : v >= 10 ? 2 : 3;
    return (n < 0 ? '-' : '') + v.toFixed(digits) + ' ' + UNITS[u];
  }
  function count(n) { return Number(n).toLocaleString('en-US'); }
  function duration(us) {
    const a = Math.abs(us);
    if (a >= 60e6) return (us / 60e6).toFixed(1) + ' min';
    if (a >= 1e6) return (us / 1e6).toFixed(a >= 1e7 ? 1 : 2) + ' s';
    if (a >= 1e3) return (us / 1e3).toFixed(a >= 1e4 ? 0 : 1) + ' ms';
    return us.toFixed(0) + ' us';
  }
  function ms(ns) { return ns / 1e6 >= 100 ? (ns / 1e6).toFixed(0) + ' ms' : (ns / 1e6).toFixed(2) + ' ms'; }
  function streamName(id) { return id === -1 ? 'no stream' : 'stream ' + id; }
  function label(id) { return id ? (data.labels[String(id)] || 'site #' + id) : ''; }
  function shortLabel(id, max) {
    const t = label(id);
    return t.length > max ? t.slice(0, max - 3) + '...' : t;
  }
  // Ticks for [0, max] of a byte quantity: multiples of 1, 2 or 5 of a binary unit.
  function byteTicks(max) {
    let unit = 1;
    while (unit * 1024 <= max) unit *= 1024;
    const raw = max / unit / 5;
    const mag = Math.pow(10, Math.floor(Math.log10(raw || 1)));
    const step = [1, 2, 5, 10].map(m => m * mag).find(m => m >= raw) * unit;
    const out = [];
    for (let v = 0; v <= max * 1.0001; v += step) out.push(v);
    return out;
  }
  function fixed(v) { return Math.round(v * 10) / 10; }
  // The grid and axis groups of a chart whose y axis is bytes in [0, yMax] (y: bytes -> SVG y),
  // with a labelled grid line at each tick between x = left and x = right.
  function byteAxis(svg, yMax, y, left, right) {
    const grid = s('g', { class: 'grid' }, svg);
    const axis = s('g', { class: 'axis' }, svg);
    for (const t of byteTicks(yMax)) {
      s('line', { x1: left, x2: right, y1: fixed(y(t)), y2: fixed(y(t)) }, grid);
      s('text', { x: left - 6, y: fixed(y(t)) + 4, 'text-anchor': 'end', text: bytes(t) }, axis);
    }
    return { grid: grid, axis: axis };
  }
  // Ticks for [0, max] of a plain number: multiples of 1, 2 or 5 times a power of ten.
  function numberTicks(max) {
    const raw = (max || 1) / 5;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map(m => m * mag).find(m => m >= raw);
    const out = [];
    for (let v = 0; v <= max * 1.0001; v += step) out.push(v);
    return out;
  }

  const ALLOCATOR_COLORS = ['#2f6fdf', '#e6553a', '#2aa876', '#9b59b6', '#f0a202', '#16a2b8', '#c2185b',
                            '#6d7a8c', '#8d6e63', '#3949ab'];
  const STREAM_COLORS = ['#ffc078', '#8ce99a', '#ffe066', '#f783ac', '#63e6be', '#e599f7', '#ffa8a8', '#a9e34b'];
  const allocators = data.allocators;
  const colorOf = {};
  allocators.forEach((a, i) => { colorOf[a.name] = ALLOCATOR_COLORS[i % ALLOCATOR_COLORS.length]; });
  const streamColor = {};
  function holeColor(stream) {
    if (stream === -1) return '#dee2e6';
    if (!(stream in streamColor))
      streamColor[stream] = STREAM_COLORS[Object.keys(streamColor).length % STREAM_COLORS.length];
    return streamColor[stream];
  }
  function allocatedColor(labelId) {  // blues, varied by allocation site
    const x = Math.imul(labelId + 1, 2654435761) >>> 0;
    return 'hsl(' + (200 + x % 40) + ',' + (45 + (x >> 8) % 25) + '%,' + (38 + (x >> 16) % 22) + '%)';
  }
  const PENDING_COLOR = '#d9480f';

  // Which allocators the charts show (legend clicks toggle); each chart registers its redraw,
  // which rescales it to what is shown.
  const hidden = new Set();
  const redraws = [];
  function markLegends() {
    for (const item of document.querySelectorAll('.legend .item[data-key]'))
      item.classList.toggle('off', hidden.has(item.dataset.key));
  }
  function setVisible() {
    for (const redraw of redraws) redraw();
    markLegends();
  }
  // An allocator that holds far more than the others (RMM's pools take half the device at the
  // start) would flatten every chart: such ones start hidden, and the memory panel says so.
  const startHidden = (() => {
    const peaks = allocators.map(a => a.result.peak_reserved_bytes).sort((p, q) => p - q);
    const median = peaks.length ? peaks[(peaks.length - 1) >> 1] : 0;
    const requested = data.summary.peak_requested;
    return allocators.filter(a => allocators.length > 2 && a.result.peak_reserved_bytes > 3 * median &&
                                  a.result.peak_reserved_bytes > 3 * requested).map(a => a.name);
  })();
  for (const name of startHidden) hidden.add(name);
  function legend(keys) {
    const box = h('div', { cls: 'legend' });
    for (const k of keys) {
      const item = h('span', { cls: 'item', 'data-key': k.key, title: k.key === 'requested' ? '' : 'click to hide or show' },
                     [h('span', { cls: 'swatch', style: 'background:' + k.color }), k.label]);
      if (k.toggles) item.addEventListener('click', () => {
        if (hidden.has(k.key)) hidden.delete(k.key); else hidden.add(k.key);
        setVisible();
      });
      box.append(item);
    }
    return box;
  }

  function panel(id, title, note, draw) {
    const sec = h('section', { cls: 'panel', id: id }, [h('h2', { text: title })]);
    if (note) sec.append(h('p', { cls: 'note', text: note }));
    document.getElementById('panels').append(sec);
    const t0 = performance.now();
    try {
      draw(sec);
      sec.dataset.ms = (performance.now() - t0).toFixed(0);
    } catch (err) {
      failures.push(title + ': ' + (err && err.stack ? err.stack : err));
      sec.append(h('p', { cls: 'note', text: 'This panel could not be drawn: ' + err }));
    }
  }

  // ---- time charts -------------------------------------------------------------------------
  const columns = data.columns.first_event.length;
  const W = 1100, ML = 74, MR = 14, MT = 10, MB = 30;
  function xOf(i) { return ML + (columns <= 1 ? 0 : i * (W - ML - MR) / (columns - 1)); }
  function columnOfEvent(ev) {  // the column holding event index ev
    const f = data.columns.first_event;
    let lo = 0, hi = f.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (f[mid] <= ev) lo = mid; else hi = mid - 1;
    }
    return lo;
  }
  function xLabel(i) {
    if (data.trace.has_times) return duration(data.columns.time_us[i] - data.columns.time_us[0]);
    return 'event ' + count(data.columns.first_event[i]);
  }

  // series: [{key, label, color, dash, min[], max[]}] (min may be absent: a plain line). Drawn
  // again, scaled to the series shown, whenever the legend changes what is hidden.
  function timeChart(parent, title, series, height) {
    const H = height || 300;
    const box = h('div', { cls: 'chart' });
    parent.append(box);
    if (title) box.append(h('h3', { text: title }));
    const svg = s('svg', { viewBox: '0 0 ' + W + ' ' + H, role: 'img', 'aria-label': title || 'chart',
                           'data-chart': 'time' });
    box.append(svg);
    const readoutBox = h('div', { cls: 'readout', hidden: '' });
    box.append(readoutBox);
    const draw = () => {
      svg.replaceChildren();
      if (columns === 0) {
        s('text', { x: ML, y: MT + 14, text: 'the trace has no events on this device' }, svg);
        return;
      }
      const shown = series.filter(se => !hidden.has(se.key) && se.max.length);
      let yMax = 1;
      for (const se of shown) for (const v of se.max) if (v > yMax) yMax = v;
      yMax *= 1.04;
      const yOf = v => MT + (H - MT - MB) * (1 - v / yMax);
      const { grid, axis } = byteAxis(svg, yMax, yOf, ML, W - MR);
      s('path', { d: 'M' + ML + ',' + MT + 'V' + (H - MB) + 'H' + (W - MR) }, axis);
      const ticks = Math.min(7, columns);
      for (let k = 0; k < ticks; k++) {
        const i = ticks <= 1 ? 0 : Math.round(k * (columns - 1) / (ticks - 1));
        s('text', { x: fixed(xOf(i)), y: H - MB + 16, 'text-anchor': k === 0 ? 'start' : k === ticks - 1 ? 'end' : 'middle',
                    text: xLabel(i) }, axis);
      }
      const iters = data.iterations;
      const every = Math.max(1, Math.ceil(iters.length / 60));  // at most 60 markers
      const marks = s('g', {}, svg);
      for (let k = 0; k < iters.length; k += every) {
        const x = fixed(xOf(columnOfEvent(iters[k])));
        tip(s('line', { class: 'iteration', x1: x, x2: x, y1: MT, y2: H - MB }, marks), 'iteration ' + (k + 1));
      }
      for (const se of shown) {
        const g = s('g', { 'data-key': se.key }, svg);
        const top = [];
        for (let i = 0; i < se.max.length; i++) top.push(fixed(xOf(i)) + ',' + fixed(yOf(se.max[i])));
        if (se.min) {
          const bottom = [];
          for (let i = se.min.length - 1; i >= 0; i--) bottom.push(fixed(xOf(i)) + ',' + fixed(yOf(se.min[i])));
          s('path', { d: 'M' + top.join('L') + 'L' + bottom.join('L') + 'Z', fill: se.color, 'fill-opacity': 0.16,
                      stroke: 'none' }, g);
        }
        s('path', { d: 'M' + top.join('L'), fill: 'none', stroke: se.color, 'stroke-width': se.width || 1.6,
                    'stroke-dasharray': se.dash || 'none', 'stroke-linejoin': 'round' }, g);
      }
      readout(box, svg, readoutBox, shown, H);
    };
    redraws.push(draw);
    draw();
    return svg;
  }

  // The values under the mouse: the column's time, its events, each shown series' min and max.
  function readout(box, svg, panelBox, series, H) {
    const cursor = s('line', { class: 'cursor', y1: MT, y2: H - MB, x1: 0, x2: 0, visibility: 'hidden' }, svg);
    const overlay = s('rect', { x: ML, y: MT, width: W - ML - MR, height: H - MT - MB, fill: 'transparent' }, svg);
    overlay.addEventListener('mouseleave', () => { panelBox.hidden = true; cursor.setAttribute('visibility', 'hidden'); });
    overlay.addEventListener('mousemove', ev => {
      const r = svg.getBoundingClientRect();
      const x = (ev.clientX - r.left) * W / r.width;
      const i = Math.max(0, Math.min(columns - 1, Math.round((x - ML) / ((W - ML - MR) / Math.max(1, columns - 1)))));
      cursor.setAttribute('visibility', 'visible');
      cursor.setAttribute('x1', xOf(i));
      cursor.setAttribute('x2', xOf(i));
      const last = i + 1 < columns ? data.columns.first_event[i + 1] - 1 : data.trace.events - 1;
      const rows = [h('tr', {}, [h('td', { text: xLabel(i) }), h('td', { text: 'events ' + count(data.columns.first_event[i]) + '-' + count(last) })])];
      for (const se of series) {
        const v = se.min && se.min[i] !== se.max[i] ? bytes(se.min[i]) + ' .. ' + bytes(se.max[i]) : bytes(se.max[i]);
        rows.push(h('tr', {}, [h('td', {}, [h('span', { cls: 'swatch', style: 'background:' + se.color }), se.label]), h('td', { text: v })]));
      }
      panelBox.replaceChildren(h('table', {}, rows));
      panelBox.hidden = false;
      const px = (ev.clientX - box.getBoundingClientRect().left);
      panelBox.style.left = (px > box.clientWidth / 2 ? px - panelBox.offsetWidth - 14 : px + 14) + 'px';
      panelBox.style.top = '40px';
    });
  }

  // ---- header ------------------------------------------------------------------------------
  function drawHeader() {
    const t = data.trace;
    const facts = [t.kind + (t.source ? ' (' + t.source + ')' : ''), count(t.events) + ' events',
                   'device ' + t.device + (t.devices.length > 1 ? ' of ' + t.devices.join(', ') + ' (--device picks another)' : ''),
                   'capacity ' + bytes(data.capacity)];
    if (data.warmup > 0) facts.push('measured after ' + data.warmup + ' warm-up pass(es)');
    if (data.iterations.length) facts.push(data.iterations.length + ' iterations');
    document.getElementById('header').append(
      h('h1', { text: 'tensorpool report: ' + t.path }),
      h('div', { cls: 'facts' }, facts.map(f => h('span', { text: f }))));
  }

  // ---- summary table and scatter -----------------------------------------------------------
  function drawSummary(sec) {
    const hasFit = allocators.some(a => a.fit);
    const head = ['allocator', 'peak reserved', 'peak allocated', 'utilization', 'waste', 'upstream calls',
                  'modelled upstream time', 'host syncs', 'OOMs'];
    if (hasFit) head.push('fits in');
    const rows = [];
    const R = a => a.result;
    // The best of each column among the allocators that ran the trace without an OOM (one that
    // refused allocations holds less because it did less).
    const clean = allocators.filter(a => R(a).ooms === 0);
    const pool = clean.length ? clean : allocators;
    const best = {
      reserved: Math.min(...pool.map(a => R(a).peak_reserved_bytes)),
      util: Math.max(...pool.map(a => R(a).utilization)),
      time: Math.min(...pool.map(a => R(a).modelled_upstream_ns)),
      calls: Math.min(...pool.map(a => R(a).upstream_ops_with_seeding)),
      fit: hasFit ? Math.min(...allocators.filter(a => a.fit && a.fit.fits).map(a => a.fit.capacity)) : 0,
    };
    const cell = (text, cls) => h('td', cls ? { cls: cls, text: text } : { text: text });
    if (data.recorded) {
      const r = data.recorded;
      const row = h('tr', { cls: 'recorded', title: 'what the recording allocator did, from the trace\'s own segment events' },
                    [cell(r.allocator + ' (recorded)'), cell(bytes(r.peak_reserved_bytes)), cell('-'),
                     cell(r.utilization.toFixed(3)), cell(bytes(r.waste_bytes)), cell(count(r.upstream_ops_with_seeding)),
                     cell('-'), cell('-'), cell(count(r.ooms))]);
      if (hasFit) row.append(cell('-'));
      rows.push(row);
    }
    for (const a of allocators) {
      const r = R(a);
      const row = h('tr', {}, [
        h('td', {}, [h('span', { cls: 'swatch', style: 'background:' + colorOf[a.name] }), a.name + (a.conf ? ' (' + a.conf + ')' : '')]),
        cell(bytes(r.peak_reserved_bytes), r.peak_reserved_bytes === best.reserved && pool.includes(a) ? 'best' : ''),
        cell(bytes(r.peak_allocated_bytes)),
        cell(r.utilization.toFixed(3), r.utilization === best.util && pool.includes(a) ? 'best' : ''),
        cell(bytes(r.waste_bytes)),
        cell(count(r.upstream_ops_with_seeding) + (r.seeding_upstream_ops ? ' (' + count(r.seeding_upstream_ops) + ' at start)' : ''),
             r.upstream_ops_with_seeding === best.calls && pool.includes(a) ? 'best' : ''),
        cell(ms(r.modelled_upstream_ns), r.modelled_upstream_ns === best.time && pool.includes(a) ? 'best' : ''),
        cell(count(r.syncs)),
        cell(count(r.ooms), r.ooms > 0 ? 'bad' : '')]);
      if (hasFit) row.append(a.fit ? cell(a.fit.fits ? bytes(a.fit.capacity) : 'no fit', a.fit.fits && a.fit.capacity === best.fit ? 'best' : '')
                                   : cell('-'));
      rows.push(row);
    }
    sec.append(h('table', { id: 'summary-table' }, [h('tr', {}, head.map(t => h('th', { text: t })))].concat(rows)),
               h('p', { cls: 'note', text: 'utilization: peak requested / peak reserved; waste: peak reserved - peak requested; ' +
                        'upstream calls: device allocations, frees, maps and unmaps (with those made for the blocks live at the ' +
                        'window start); modelled time: what the simulated device\'s cost model charges for them. Best value of each column in green ' +
                        '(among the allocators without an OOM).' }));
    const scatter = h('div', { style: 'max-width:640px' });
    sec.append(scatter);
    drawScatter(scatter);
  }

  // Peak reserved against modelled upstream time, one point per allocator: lower left is better.
  function drawScatter(parent) {
    const SW = 560, SH = 330, L = 74, Rm = 90, T = 14, B = 40;
    parent.append(h('h3', { text: 'memory against upstream time' }));
    const svg = s('svg', { viewBox: '0 0 ' + SW + ' ' + SH, 'data-chart': 'scatter', role: 'img', 'aria-label': 'scatter' });
    parent.append(svg);
    const all = allocators.map(a => ({ name: a.name, x: a.result.modelled_upstream_ns / 1e6, y: a.result.peak_reserved_bytes }));
    const draw = () => {
      svg.replaceChildren();
      const pts = all.filter(p => !hidden.has(p.name));
      if (!pts.length) return;
      const xs = pts.map(p => p.x);
      const xMinV = Math.min(...xs), xMaxV = Math.max(...xs);
      const log = xMinV > 0 && xMaxV / xMinV > 30;
      const fx = log ? v => Math.log10(v) : v => v;
      const x0 = log ? Math.floor(fx(xMinV)) : 0;
      let x1 = log ? Math.ceil(fx(xMaxV)) : (xMaxV || 1) * 1.1;
      if (x1 === x0) x1 = x0 + 1;
      const yMax = Math.max(...pts.map(p => p.y), 1) * 1.1;
      const X = v => L + (SW - L - Rm) * (fx(v) - x0) / (x1 - x0);
      const Y = v => T + (SH - T - B) * (1 - v / yMax);
      const { grid, axis } = byteAxis(svg, yMax, Y, L, SW - Rm);
      const xt = log ? Array.from({ length: x1 - x0 + 1 }, (_, k) => Math.pow(10, x0 + k)) : numberTicks(x1);
      for (const t of xt) {
        s('line', { x1: fixed(X(t)), x2: fixed(X(t)), y1: T, y2: SH - B }, grid);
        s('text', { x: fixed(X(t)), y: SH - B + 15, 'text-anchor': 'middle', text: t >= 1 || t === 0 ? count(t) + ' ms' : t.toPrecision(1) + ' ms' }, axis);
      }
      s('path', { d: 'M' + L + ',' + T + 'V' + (SH - B) + 'H' + (SW - Rm) }, axis);
      s('text', { x: (L + SW - Rm) / 2, y: SH - 6, 'text-anchor': 'middle',
                  text: 'modelled upstream time' + (log ? ' (log scale)' : '') + ' -- lower left is better' }, axis);
      // Labels right of their point, pushed down while they would cover a point or a label
      // placed before (boxes: about 6.5 units a character, 12 high).
      const placed = pts.map(p => ({ p: p, cx: fixed(X(Math.max(p.x, log ? Math.pow(10, x0) : 0))), cy: fixed(Y(p.y)) }))
                        .sort((a, b) => a.cy - b.cy);
      const boxes = placed.map(q => ({ x0: q.cx - 7, x1: q.cx + 7, y0: q.cy - 7, y1: q.cy + 7 }));
      const overlaps = (a, b) => a.x0 < b.x1 && b.x0 < a.x1 && a.y0 < b.y1 && b.y0 < a.y1;
      for (const q of placed) {
        let ly = q.cy + 4;
        const box = () => ({ x0: q.cx + 9, x1: q.cx + 9 + 6.5 * q.p.name.length, y0: ly - 10, y1: ly + 2 });
        for (let tries = 0; tries < 20 && boxes.some(b => overlaps(b, box())); tries++) ly += 12;
        boxes.push(box());
        const g = s('g', { 'data-key': q.p.name }, svg);
        tip(s('path', { d: 'M' + (q.cx - 6) + ',' + q.cy + 'a6,6 0 1,0 12,0a6,6 0 1,0 -12,0', fill: colorOf[q.p.name], stroke: '#fff' }, g),
            q.p.name + ': ' + bytes(q.p.y) + ' reserved at peak, ' + q.p.x.toFixed(2) + ' ms upstream');
        if (ly !== q.cy + 4)  // a label pushed away from its point: a leader line to it
          s('path', { d: 'M' + (q.cx + 4) + ',' + (q.cy + 4) + 'L' + (q.cx + 8) + ',' + (ly - 4), stroke: '#9aa3af', fill: 'none' }, g);
        s('text', { x: q.cx + 9, y: ly, text: q.p.name, style: 'fill:#1d2430' }, g);
      }
    };
    redraws.push(draw);
    draw();
  }

  // ---- memory and fragmentation over time --------------------------------------------------
  function drawMemory(sec) {
    if (startHidden.length)
      sec.append(h('p', { cls: 'note', text: startHidden.join(', ') + ' start hidden here and in the scatter: each holds far more than the others ' +
                          '(' + startHidden.map(n => bytes(allocators.find(a => a.name === n).result.peak_reserved_bytes)).join(', ') +
                          ') and would flatten the charts; click a name to show it.' }));
    sec.append(legend([{ key: 'requested', label: 'requested (the trace)', color: '#1d2430' }].concat(
      allocators.map(a => ({ key: a.name, label: a.name, color: colorOf[a.name], toggles: true })))));
    const series = [{ key: 'requested', label: 'requested', color: '#1d2430', min: data.requested.min, max: data.requested.max, width: 1.2 }];
    for (const a of allocators) {
      series.push({ key: a.name, label: a.name + ' reserved', color: colorOf[a.name], min: a.reserved.min, max: a.reserved.max });
      series.push({ key: a.name, label: a.name + ' allocated', color: colorOf[a.name], min: a.allocated.min, max: a.allocated.max,
                    dash: '5 3', width: 1.2 });
    }
    timeChart(sec, '', series, 340);
  }

  function drawFragmentation(sec) {
    sec.append(legend(allocators.map(a => ({ key: a.name, label: a.name, color: colorOf[a.name], toggles: true }))));
    timeChart(sec, 'reserved - allocated (cached, unused)',
              allocators.map(a => ({ key: a.name, label: a.name, color: colorOf[a.name], min: a.unallocated.min, max: a.unallocated.max })), 240);
    const withMap = allocators.filter(a => a.largest_free.length);
    if (!withMap.length) return;
    timeChart(sec, 'largest free block',
              withMap.map(a => ({ key: a.name, label: a.name, color: colorOf[a.name], max: a.largest_free, width: 1.3 })), 240);
  }

  // ---- segment and block maps --------------------------------------------------------------
  const MAP_ROWS = 8, ROW_H = 15, ROW_GAP = 4;
  const STATE = ['free', 'allocated', 'pending free', 'unmapped'];

  function blockColor(b) {
    if (b[2] === 1) return allocatedColor(b[4]);
    if (b[2] === 2) return PENDING_COLOR;
    return holeColor(b[3]);
  }

  // The mapped bytes of a map laid end to end in address order, wrapped into MAP_ROWS rows.
  function memoryMap(parent, map, title) {
    const box = h('div', { cls: 'mapbox' });
    parent.append(box);
    if (title) box.append(h('h3', { text: title }));
    let total = 0, allocated = 0, free = 0, pending = 0, holes = [];
    for (const seg of map.segments) {
      for (const b of seg[4]) {
        if (b[2] === 3) continue;
        total += b[1];
        if (b[2] === 1) allocated += b[1];
        else if (b[2] === 2) pending += b[1];
        else { free += b[1]; holes.push({ seg: seg, b: b }); }
      }
    }
    holes.sort((p, q) => q.b[1] - p.b[1]);
    box.append(h('p', { cls: 'facts', text: map.segments.length + ' segments holding ' + bytes(total) + ': ' + bytes(allocated) +
      ' allocated, ' + bytes(free) + ' free in ' + count(holes.length) + ' holes' +
      (holes.length ? ' (largest ' + bytes(holes[0].b[1]) + ', held by ' + streamName(holes[0].b[3]) + ')' : '') +
      (pending ? ', ' + bytes(pending) + ' pending free' : '') }));
    const H = MAP_ROWS * (ROW_H + ROW_GAP);
    const svg = s('svg', { viewBox: '0 0 ' + W + ' ' + H, 'data-chart': 'map', role: 'img', 'aria-label': title || 'memory map' });
    box.append(svg);
    if (total === 0) {
      s('text', { x: 4, y: 14, text: 'nothing held from the device at that moment' }, svg);
      return;
    }
    const perRow = total / MAP_ROWS;
    const scale = W / perRow;
    const rowY = row => row * (ROW_H + ROW_GAP);
    // Runs of consecutive blocks of one colour, then their pieces (a run wraps across rows). The
    // rects are written as markup in one go (thousands of blocks), the tooltip found by a search
    // over the pieces of the row under the mouse.
    const runs = [];
    const ticks = [];
    let pos = 0;
    for (const seg of map.segments) {
      const segMapped = seg[4].reduce((n, b) => n + (b[2] === 3 ? 0 : b[1]), 0);
      if (segMapped === 0) continue;
      if (segMapped * scale >= 3) ticks.push(pos);
      let run = null;
      for (const b of seg[4]) {
        if (b[2] === 3) continue;
        const fill = blockColor(b);
        if (run && run.fill === fill) { run.size += b[1]; run.n++; }
        else { run = { from: pos, size: b[1], fill: fill, seg: seg, b: b, n: 1 }; runs.push(run); }
        pos += b[1];
      }
    }
    const pieces = [];
    for (const run of runs) {
      let at = run.from, left = run.size;
      while (left > 0) {
        const row = Math.min(MAP_ROWS - 1, Math.floor(at / perRow));
        let inRow = Math.min(left, (row + 1) * perRow - at);
        if (!(inRow > 0)) inRow = left;  // the last row takes what rounding left over
        const x = (at - row * perRow) * scale;
        pieces.push({ row: row, x0: x, x1: x + inRow * scale, run: run });
        at += inRow;
        left -= inRow;
      }
    }
    const markup = pieces.map(p => '<rect x="' + fixed(p.x0) + '" y="' + rowY(p.row) + '" width="' + Math.max(0.4, fixed(p.x1 - p.x0)) +
                                   '" height="' + ROW_H + '" fill="' + p.run.fill + '"></rect>');
    for (const t of ticks) {
      const row = Math.min(MAP_ROWS - 1, Math.floor(t / perRow));
      const x = fixed((t - row * perRow) * scale);
      markup.push('<line x1="' + x + '" x2="' + x + '" y1="' + (rowY(row) - 1) + '" y2="' + (rowY(row) + ROW_H + 1) +
                  '" stroke="#1d2430" stroke-width="1.2"></line>');
    }
    s('g', {}, svg).innerHTML = markup.join('');
    const describe = run => {
      const b = run.b, seg = run.seg;
      const what = run.n === 1 ? STATE[b[2]] + ' ' + bytes(b[1]) + (b[2] === 1 && b[5] ? ' (requested ' + bytes(b[5]) + ')' : '')
                               : run.n + ' ' + STATE[b[2]] + ' blocks, ' + bytes(run.size);
      return [what + ', ' + streamName(b[3]), b[4] ? (run.n === 1 ? '' : 'the first: ') + shortLabel(b[4], 100) : '',
              'segment 0x' + seg[0].toString(16) + ', ' + bytes(seg[1]) + (seg[3] ? ' (virtual range)' : '') + ', ' + streamName(seg[2])];
    };
    const readoutBox = h('div', { cls: 'readout', hidden: '' });
    box.style.position = 'relative';
    box.append(readoutBox);
    svg.addEventListener('mouseleave', () => { readoutBox.hidden = true; });
    svg.addEventListener('mousemove', ev => {
      const r = svg.getBoundingClientRect();
      const x = (ev.clientX - r.left) * W / r.width, y = (ev.clientY - r.top) * W / r.width;
      const row = Math.floor(y / (ROW_H + ROW_GAP));
      let lo = 0, hi = pieces.length - 1, hit = null;
      while (lo <= hi) {  // pieces are in (row, x) order
        const mid = (lo + hi) >> 1, p = pieces[mid];
        if (p.row < row || (p.row === row && p.x1 <= x)) lo = mid + 1;
        else if (p.row > row || p.x0 > x) hi = mid - 1;
        else { hit = p; break; }
      }
      if (!hit) { readoutBox.hidden = true; return; }
      readoutBox.replaceChildren(...describe(hit.run).filter(t => t).map(t => h('div', { text: t })));
      readoutBox.hidden = false;
      const px = ev.clientX - box.getBoundingClientRect().left;
      readoutBox.style.left = (px > box.clientWidth / 2 ? px - readoutBox.offsetWidth - 14 : px + 14) + 'px';
      readoutBox.style.top = (ev.clientY - box.getBoundingClientRect().top + 16) + 'px';
    });
    const streams = [...new Set(holes.map(x => x.b[3]))];
    const keys = [{ key: 'a', label: 'allocated (shade: allocation site)', color: allocatedColor(0) }];
    for (const st of streams) keys.push({ key: 's' + st, label: 'free, ' + streamName(st), color: holeColor(st) });
    if (pending) keys.push({ key: 'p', label: 'pending free (waiting for a stream)', color: PENDING_COLOR });
    box.append(legend(keys));
    if (holes.length) {
      const rows = holes.slice(0, 5).map(x => {
        const blocks = x.seg[4];
        const i = blocks.indexOf(x.b);
        const near = [blocks[i - 1], blocks[i + 1]].filter(n => n && n[2] === 1 && n[4]).map(n => shortLabel(n[4], 60));
        return h('tr', {}, [h('td', { text: bytes(x.b[1]) }), h('td', { text: streamName(x.b[3]) }),
                            h('td', { text: '0x' + x.seg[0].toString(16) + ' (' + bytes(x.seg[1]) + ')' }),
                            h('td', { cls: 'site', text: near.join('  |  ') || '-' })]);
      });
      box.append(h('table', {}, [h('tr', {}, ['largest holes', 'held by', 'in segment', 'next to'].map(t => h('th', { text: t, cls: t === 'next to' ? 'site' : '' })))].concat(rows)));
    }
  }

  function drawPeakMaps(sec) {
    for (const a of allocators) {
      if (!a.peak_map) {
        sec.append(h('h3', { text: a.name }), h('p', { cls: 'note', text: a.name + ' keeps no map of its memory that tensorpool can read.' }));
        continue;
      }
      const p = a.peak;
      memoryMap(sec, a.peak_map, a.name + ': ' + bytes(p.reserved) + ' reserved, ' + bytes(p.allocated) + ' allocated, at event ' +
                count(p.event) + (data.trace.has_times ? ' (' + duration(p.time_us - (data.columns.time_us[0] || 0)) + ')' : ''));
    }
  }

  // ---- the first OOM -----------------------------------------------------------------------
  // What the figures of an OOM say, in one sentence: where the allocator could still have grown
  // (the device's free memory, within its own limit if it has one) and what it held.
  function verdict(o) {
    const need = o.rounded_bytes || o.requested_bytes;
    const cached = o.reserved_unallocated_bytes;
    const limited = o.memory_limit_bytes && o.memory_limit_bytes - o.reserved_bytes < o.device_free_bytes;
    const room = limited ? Math.max(0, o.memory_limit_bytes - o.reserved_bytes) : o.device_free_bytes;
    const roomText = limited ? 'its own limit (' + bytes(o.memory_limit_bytes) + ') leaves it ' + bytes(room) + ' to grow'
                             : 'the device has ' + bytes(room) + ' left to grow into';
    if (o.largest_free_block_bytes < need && cached + room >= need)
      return 'Fragmentation: ' + bytes(cached) + ' is cached but unused and ' + roomText + ', more than the ' + bytes(need) +
             ' asked for together, but the largest free block is ' + bytes(o.largest_free_block_bytes) + '.';
    const ceiling = limited ? o.memory_limit_bytes : o.capacity_bytes;
    if (o.allocated_bytes + need > ceiling)
      return 'Not enough memory: the live blocks (' + bytes(o.allocated_bytes) + ') and the request (' + bytes(need) +
             ') need more than ' + (limited ? 'the allocator\'s limit' : 'the device') + ' (' + bytes(ceiling) + ').';
    return 'The free memory is held where this request cannot use it (' + roomText + '; ' + bytes(cached) +
           ' cached, largest free block ' + bytes(o.largest_free_block_bytes) + ').';
  }

  function drawOoms(sec) {
    const hit = allocators.filter(a => a.result.first_oom);
    if (!hit.length) {
      sec.append(h('p', { text: 'No allocator ran out of memory on a device of ' + bytes(data.capacity) +
                               ' (replay with a smaller --capacity to see where each one would fail).' }));
      return;
    }
    for (const a of hit) {
      const o = a.result.first_oom;
      sec.append(h('h3', {}, [h('span', { cls: 'swatch', style: 'background:' + colorOf[a.name] }),
                              a.name + ': ' + count(a.result.ooms) + ' refused allocation(s); the first at event ' + count(o.event) +
                              (data.trace.has_times ? ' (' + duration(o.time_us - (data.columns.time_us[0] || 0)) + ')' : '')]));
      sec.append(h('p', { cls: 'verdict', text: verdict(o) }));
      const fields = [['request', bytes(o.requested_bytes) + (o.rounded_bytes !== o.requested_bytes ? ' (' + bytes(o.rounded_bytes) + ' rounded)' : '') +
                       ' on ' + streamName(o.stream)],
                      ['allocated by', o.label || '-'], ['device capacity', bytes(o.capacity_bytes)], ['device free', bytes(o.device_free_bytes)],
                      ['reserved', bytes(o.reserved_bytes)], ['allocated', bytes(o.allocated_bytes)],
                      ['reserved but unallocated', bytes(o.reserved_unallocated_bytes)], ['largest free block', bytes(o.largest_free_block_bytes)]];
      if (o.memory_limit_bytes) fields.push(['memory limit', bytes(o.memory_limit_bytes)]);
      fields.push(['cached free per stream', o.cached_per_stream.length ? o.cached_per_stream.map(c => streamName(c.stream) + ': ' + bytes(c.bytes)).join(', ') : 'none']);
      const dl = h('dl', { cls: 'oom' });
      for (const [k, v] of fields) dl.append(h('dt', { text: k }), h('dd', { text: v }));
      sec.append(dl);
      if (a.oom_map) memoryMap(sec, a.oom_map, 'the map of ' + a.name + ' at that moment');
    }
  }

  // ---- the trace: histograms and allocation sites -------------------------------------------
  function histogram(parent, title, hist, isBytes) {
    parent.append(h('h3', { text: title }));
    const n = hist.counts.length;
    const HW = 540, HH = 240, L = 44, T = 10, B = 46;
    const svg = s('svg', { viewBox: '0 0 ' + HW + ' ' + HH, 'data-chart': 'histogram', role: 'img', 'aria-label': title });
    parent.append(svg);
    const totalCount = hist.counts.reduce((a, b) => a + b, 0) || 1;
    const totalBytes = hist.bytes.reduce((a, b) => a + b, 0) || 1;
    const slot = (HW - L - 8) / n;
    const Y = f => T + (HH - T - B) * (1 - f);
    const axis = s('g', { class: 'axis' }, svg);
    const grid = s('g', { class: 'grid' }, svg);
    for (const f of [0, 0.25, 0.5, 0.75, 1]) {
      s('line', { x1: L, x2: HW - 8, y1: fixed(Y(f)), y2: fixed(Y(f)) }, grid);
      s('text', { x: L - 5, y: fixed(Y(f)) + 4, 'text-anchor': 'end', text: (f * 100) + '%' }, axis);
    }
    const bound = v => isBytes ? bytes(v).replace('.000', '').replace('.00', '').replace('.0 ', ' ') : count(v);
    for (let i = 0; i < n; i++) {
      const x = L + i * slot;
      const name = i < hist.bounds.length ? bound(hist.bounds[i]) : '> ' + bound(hist.bounds[hist.bounds.length - 1]);
      const fc = hist.counts[i] / totalCount, fb = hist.bytes[i] / totalBytes;
      const bw = slot * 0.36;
      tip(s('path', { d: 'M' + fixed(x + slot * 0.12) + ',' + fixed(Y(0)) + 'V' + fixed(Y(fc)) + 'h' + fixed(bw) + 'V' + fixed(Y(0)) + 'Z', fill: '#2f6fdf' }, svg),
          name + ': ' + count(hist.counts[i]) + ' allocations');
      tip(s('path', { d: 'M' + fixed(x + slot * 0.5) + ',' + fixed(Y(0)) + 'V' + fixed(Y(fb)) + 'h' + fixed(bw) + 'V' + fixed(Y(0)) + 'Z', fill: '#f0a202' }, svg),
          name + ': ' + bytes(hist.bytes[i]));
      s('text', { x: fixed(x + slot / 2), y: HH - B + 14, 'text-anchor': 'middle', text: name }, axis);
    }
    s('path', { d: 'M' + L + ',' + T + 'V' + (HH - B) + 'H' + (HW - 8) }, axis);
    parent.append(legend([{ key: 'c', label: 'share of allocations', color: '#2f6fdf' }, { key: 'b', label: 'share of bytes', color: '#f0a202' }]),
                  h('p', { cls: 'note', text: 'Each bar counts values up to its label, above the previous one.' }));
  }

  function drawTrace(sec) {
    const row = h('div', { cls: 'row' });
    const left = h('div', {}), right = h('div', {});
    row.append(left, right);
    sec.append(row);
    histogram(left, 'allocation sizes', data.summary.sizes, true);
    histogram(right, 'lifetimes (events from allocation to free)', data.summary.lifetimes, false);
    sec.append(h('p', { cls: 'note', text: count(data.summary.never_freed) + ' allocations are never freed in the window.' }));
  }

  function drawSites(sec) {
    const sites = data.top_sites;
    if (!sites.length) {
      sec.append(h('p', { text: 'The trace allocates nothing.' }));
      return;
    }
    const top = sites[0].bytes || 1;
    const rows = sites.map((x, i) => h('tr', {}, [
      h('td', { text: String(i + 1) }), h('td', { text: bytes(x.bytes) }), h('td', { text: count(x.blocks) }),
      h('td', {}, [s('svg', { width: 120, height: 10, viewBox: '0 0 120 10', style: 'display:inline;width:120px' })]),
      h('td', { cls: 'site', title: label(x.label), text: x.label ? shortLabel(x.label, 140) : '(no site recorded)' })]));
    rows.forEach((r, i) => s('rect', { x: 0, y: 0, height: 10, width: fixed(120 * sites[i].bytes / top), fill: allocatedColor(sites[i].label) },
                             r.children[3].firstChild));
    sec.append(h('table', { id: 'sites-table' }, [h('tr', {}, ['#', 'bytes', 'blocks', '', 'allocation site'].map(t => h('th', { text: t, cls: t === 'allocation site' ? 'site' : '' })))].concat(rows)));
  }

  // ---- the page ----------------------------------------------------------------------------
  try {
    drawHeader();
    panel('summary', 'Summary', 'Each allocator replayed the trace on a simulated device of ' + bytes(data.capacity) + '.', drawSummary);
    panel('memory', 'Memory over time',
          'Per column, the range of each quantity over its events (min to max, so no peak is lost); solid: reserved, dashed: allocated; ' +
          'dotted verticals: iterations. Click a name to hide or show it; hover for values.', drawMemory);
    panel('fragmentation', 'Fragmentation over time',
          'Cached memory no live block uses, and the largest free block (sampled once per column): a request larger than it needs new device memory.',
          drawFragmentation);
    panel('maps', 'Segments and blocks at the peak of reserved',
          'Each allocator\'s memory at its fullest moment of peak reserved, segments end to end in address order (dark ticks: segment starts). ' +
          'Free blocks are coloured by the stream that holds them; hover a block for its size, stream and allocation site.', drawPeakMaps);
    panel('oom', 'Out of memory', 'The first allocation each allocator refused, explained, and its memory at that moment.', drawOoms);
    panel('trace', 'The trace', 'Sizes and lifetimes of the device\'s allocations.', drawTrace);
    panel('sites', 'Allocation sites at the peak of requested bytes',
          'The sites holding the most bytes when the trace\'s live requests peaked (' + bytes(data.summary.peak_requested) + ' at event ' +
          count(data.summary.peak_requested_event) + ').', drawSites);
  } catch (err) {
    failures.push(String(err && err.stack ? err.stack : err));
  }
  markLegends();
  const elapsed = performance.now() - started;
  document.getElementById('footer').textContent = data.tool + '; drawn in ' + elapsed.toFixed(0) + ' ms.';
  if (failures.length) {
    const box = document.getElementById('errors');
    box.hidden = false;
    box.textContent = 'Some panels could not be drawn:\n' + failures.join('\n');
    for (const f of failures) console.error(f);
  }
  document.body.dataset.renderMs = elapsed.toFixed(0);
  document.body.dataset.openMs = performance.now().toFixed(0);  // since the navigation started
  document.body.dataset.rendered = failures.length ? 'error' : 'ok';
})();

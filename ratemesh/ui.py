"""The live pages (`GET /ui`) of a mesh node and of governord, in one place: one
self-contained HTML document each (inline CSS and JS, no external asset, no CDN), built from
a shared frame (style, the refresh loop, table and bar helpers) and a per-daemon renderer.

Each page polls one JSON document on its own origin every `REFRESH_MS` and redraws from it:
the node's `/health` (mesh/telemetry/_routes.py adds the per-limit numbers), governord's
`/ui/status` (governor/server/_ui.py). Every value is written with `textContent`, never as
HTML, so a tenant's name cannot inject markup. Cells carry `data-field` and rows `data-key`,
and the last document drawn is `window.lastDoc` with its count `window.refreshes`: the
browser test (tests/ops/test_ui.py) reads them to check the page against the JSON.
"""

from __future__ import annotations

__all__ = ["REFRESH_MS", "node_page", "governord_page"]

REFRESH_MS = 1000

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.2em;color:#1b1f24;background:#f6f8fa}
h1{font-size:1.3em;margin:0 0 .2em} h2{font-size:1.05em;margin:1.2em 0 .4em}
table{border-collapse:collapse;background:#fff;min-width:40em}
th,td{border:1px solid #d0d7de;padding:.25em .6em;text-align:right;white-space:nowrap}
th{background:#eaeef2} td.l,th.l{text-align:left}
.bar{display:inline-block;width:8em;height:.7em;background:#eaeef2;margin-left:.4em;
vertical-align:middle;position:relative}
.bar i{position:absolute;left:0;top:0;bottom:0;background:#2da44e}
.bar.hot i{background:#cf222e}
td.wrap{white-space:normal;word-break:break-all;max-width:18em}
.bad{color:#cf222e;font-weight:600} .ok{color:#1a7f37} #meta{color:#57606a}
"""

_FRAME_JS = """
function el(tag, text, cls){const e=document.createElement(tag);
  if(text!==undefined&&text!==null)e.textContent=String(text); if(cls)e.className=cls; return e;}
function num(x){return (x===undefined||x===null)?'-':
  (Number.isInteger(x)?x.toLocaleString('en-US'):Number(x).toFixed(3));}
function bar(v, of){const b=el('span',null,'bar'); const i=el('i');
  const f=of>0?Math.min(1,v/of):0; i.style.width=(100*f)+'%'; if(of>0&&v>of)b.className='bar hot';
  b.appendChild(i); return b;}
function cell(tr, field, text, cls, extra){const td=el('td',text,cls);
  if(field)td.dataset.field=field; if(extra)td.appendChild(extra); tr.appendChild(td); return td;}
function table(id, heads, rows){const t=document.getElementById(id); t.textContent='';
  const h=el('tr'); heads.forEach(x=>h.appendChild(el('th',x[0],x[1]))); t.appendChild(h);
  rows.forEach(r=>t.appendChild(r)); if(!rows.length){const tr=el('tr');
  const td=el('td','none','l'); td.colSpan=heads.length; tr.appendChild(td); t.appendChild(tr);}}
window.refreshes=0; window.lastDoc=null;
async function tick(){
  try{const r=await fetch(SOURCE,{cache:'no-store'}); const doc=await r.json();
    const now=performance.now(); render(doc, window.lastDoc, (now-(window.lastAt||now))/1000);
    window.lastDoc=doc; window.lastAt=now; window.refreshes++;
    document.getElementById('meta').textContent='refreshed '+new Date().toISOString()+
      ' from '+SOURCE+' every '+REFRESH_MS+' ms';
  }catch(err){document.getElementById('meta').textContent='cannot read '+SOURCE+': '+err;}
  setTimeout(tick, REFRESH_MS);}
"""

_NODE_BODY = """
<h1>ratemesh node <span id="member"></span></h1><div id="meta"></div><div id="summary"></div>
<h2>Limits: admitted against limit, excess against bound</h2><table id="limits"></table>
<h2>Tenants served under a default policy</h2><div id="served_more"></div>
<table id="served"></table>
<h2>Suspensions</h2><table id="suspended"></table>
<h2>Members and the generations this member enforces</h2><table id="members"></table>
<table id="enforced" style="margin-top:.6em"></table>
"""

_NODE_JS = """
function key(x){return x.tenant+(x.descriptor?'['+x.descriptor+']':'')+'|'+x.metric;}
function render(h, prev, dt){
  document.getElementById('member').textContent=h.member_id+' ('+h.status+')';
  const m=h.membership; const s=document.getElementById('summary'); s.textContent='';
  s.appendChild(el('span','N='+m.N+' ring epoch '+m.epoch+' d='+h.d_ms+' ms ',null));
  s.appendChild(el('span',m.stale?'membership STALE':'membership fresh',m.stale?'bad':'ok'));
  const before={}; (prev?prev.limits:[]).forEach(x=>before[key(x)]=x);
  table('limits',[['tenant','l'],['metric','l'],['mode','l'],['gen'],['admitted'],
    ['admitted/s'],['limit/s'],['burst'],['denied'],['excess estimate'],['excess bound'],
    ['bound','l'],['suspended','l']], h.limits.map(x=>{
      const tr=el('tr'); tr.dataset.key=key(x); const p=before[key(x)];
      const rate=(p&&dt>0&&x.admitted>=p.admitted)?(x.admitted-p.admitted)/dt:null;
      cell(tr,'tenant',x.tenant+(x.descriptor?'['+x.descriptor+']':''),'l');
      cell(tr,'metric',x.metric,'l'); cell(tr,'mode',x.mode,'l');
      cell(tr,'generation',x.generation); cell(tr,'admitted',num(x.admitted));
      const lim=Number(x.target_rate);
      cell(tr,'admitted_rate',rate===null?'-':rate.toFixed(1),null,
        rate===null?null:bar(rate,lim));
      cell(tr,'target_rate',x.target_rate); cell(tr,'global_burst',x.global_burst);
      cell(tr,'denied',num(x.denied));
      const hot=x.excess_estimate>x.excess_bound;
      cell(tr,'excess_estimate',num(x.excess_estimate),hot?'bad':null,
        x.excess_bound===undefined?null:bar(x.excess_estimate,x.excess_bound));
      cell(tr,'excess_bound',num(x.excess_bound)); cell(tr,'bound',x.bound,'l wrap');
      cell(tr,'suspended',x.suspended||'-',x.suspended?'l bad':'l'); return tr;}));
  table('served',[['tenant','l'],['metric','l'],['policy','l'],['mode','l'],['admitted'],
    ['denied'],['excess estimate'],['excess bound']], (h.served||[]).map(x=>{
      const tr=el('tr'); tr.dataset.key=x.tenant+'|'+x.metric;
      cell(tr,'tenant',x.tenant,'l'); cell(tr,'metric',x.metric,'l');
      cell(tr,'policy',x.policy||'-','l'); cell(tr,'mode',x.mode||'-','l');
      cell(tr,'admitted',num(x.admitted)); cell(tr,'denied',num(x.denied));
      cell(tr,'excess_estimate',num(x.excess_estimate));
      cell(tr,'excess_bound',num(x.excess_bound));
      return tr;}));
  document.getElementById('served_more').textContent=h.served_omitted?
    (h.served_omitted+' more not shown (the busiest are)'):'';
  const links=(h.peer&&h.peer.links)||{};
  function reach(id){if(id===h.member_id)return ['this member','ok'];
    const lk=links[id]; if(!lk)return ['-',null];
    return lk.connected?['reachable','ok']:
      ['unreachable'+(lk.last_error?': '+lk.last_error:''),'bad'];}
  table('suspended',[['tenant','l'],['metric','l'],['reason','l'],['owner','l'],
    ['owner reachable','l']], h.suspended.map(x=>{
    const tr=el('tr'); tr.dataset.key=key(x)+'|'+x.reason;
    cell(tr,'tenant',x.tenant+(x.descriptor?'['+x.descriptor+']':''),'l');
    cell(tr,'metric',x.metric,'l'); cell(tr,'reason',x.reason,'l bad');
    cell(tr,'owner',x.owner||'-','l'); const r=x.owner?reach(x.owner):['-',null];
    cell(tr,'owner_reachable',r[0],r[1]?'l '+r[1]:'l'); return tr;}));
  table('members',[['member','l'],['this one','l'],['reachable','l']], m.members.map(id=>{
    const tr=el('tr'); tr.dataset.key=id; cell(tr,'member',id,'l');
    cell(tr,'self',id===h.member_id?'yes':'','l'); const r=reach(id);
    cell(tr,'reachable',r[0],r[1]?'l '+r[1]:'l'); return tr;}));
  table('enforced',[['tenant','l'],['metric','l'],['generation enforced']],
    h.policies.enforced.map(x=>{const tr=el('tr'); tr.dataset.key=key(x);
      cell(tr,'tenant',x.tenant+(x.descriptor?'['+x.descriptor+']':''),'l');
      cell(tr,'metric',x.metric,'l'); cell(tr,'generation',x.generation); return tr;}));
}
"""

_GOVERNORD_BODY = """
<h1>governord <span id="role"></span></h1><div id="meta"></div><div id="summary"></div>
<h2>Role, leader and store (from /health)</h2><table id="health"></table>
<h2>The tree: used against cap, leases held against limit, outstanding credit</h2>
<table id="tree"></table>
<h2>Mesh policies served</h2><div id="policies_meta"></div><table id="policies"></table>
"""

_GOVERNORD_JS = """
function yes(b){return b?['yes','ok']:['NO','bad'];}
function drawHealth(h){
  window.lastHealth=h; const c=h.checks||{}; const lead=c.leader||{}; const st=c.store||{};
  const w=c.writer||{};
  document.getElementById('role').textContent='('+h.role+', '+h.status+')';
  const rows=[['role',h.role,h.role==='leader'?'ok':null],
    ['leader',lead.leader||(h.role==='leader'?'this process':'unknown'),null],
    ['epoch',lead.epoch===undefined||lead.epoch===null?'-':lead.epoch,null],
    ['ready',...yes(h.ready)], ['store',(st.ok?'ok':'FAILING')+' ('+(st.kind||'-')+
      (st.probe_ms!==undefined?', probe '+st.probe_ms+' ms':'')+')'+(st.error?': '+st.error:''),
      st.ok?'ok':'bad'],
    ['writer',(w.ok?'ok':'STALLED')+', committed seq '+num(w.committed_seq)+', pending '+
      num(w.pending_events), w.ok?'ok':'bad']];
  table('health',[['check','l'],['state','l']], rows.map(r=>{const tr=el('tr');
    tr.dataset.key=r[0]; cell(tr,'check',r[0],'l'); cell(tr,'state',r[1],r[2]?'l '+r[2]:'l');
    return tr;}));}
async function health(){try{const r=await fetch('/health',{cache:'no-store'});
  drawHealth(await r.json());}catch(err){document.getElementById('role').textContent=
  '(cannot read /health: '+err+')';}}
function render(d){
  health();
  const pol=d.policies||{served:[],count:0,omitted:0,revision:0};
  document.getElementById('policies_meta').textContent=pol.count+' served, revision '+
    pol.revision+(pol.omitted?', '+pol.omitted+' not shown':'');
  table('policies',[['tenant','l'],['metric','l'],['generation'],['mode','l'],['rate'],
    ['burst'],['local burst cap']], pol.served.map(p=>{const tr=el('tr');
      tr.dataset.key=p.tenant_id+'|'+p.metric; cell(tr,'tenant',p.tenant_id,'l');
      cell(tr,'metric',p.metric,'l'); cell(tr,'generation',p.generation);
      cell(tr,'mode',p.mode,'l'); cell(tr,'target_rate',p.target_rate);
      cell(tr,'global_burst',p.global_burst); cell(tr,'local_burst_cap',p.local_burst_cap);
      return tr;}));
  const s=document.getElementById('summary');
  s.textContent='nodes '+d.nodes+' ('+d.nodes_omitted+' not shown), sessions '+d.sessions+
    ', queued '+d.queued;
  table('tree',[['node','l'],['resource','l'],['used'],['cap'],['held'],['limit'],
    ['rate/s'],['burst'],['credit level'],['credit outstanding']], d.tree.flatMap(n=>{
      const names=[...new Set([...Object.keys(n.used),...Object.keys(n.quotas),
        ...Object.keys(n.held),...Object.keys(n.limits),...Object.keys(n.credit)])].sort();
      if(!names.length)names.push('');
      return names.map((r,i)=>{const tr=el('tr'); tr.dataset.key=n.path+'|'+r;
        cell(tr,'node',i?'':'\\u00a0'.repeat(4*n.depth)+n.name,'l'); cell(tr,'resource',r,'l');
        const cap=n.quotas[r]; cell(tr,'used',num(n.used[r]||0),null,
          cap===undefined?null:bar(n.used[r]||0,cap));
        cell(tr,'cap',num(cap)); cell(tr,'held',num(n.held[r]));
        cell(tr,'limit',num(n.limits[r])); const c=n.credit[r]||{};
        cell(tr,'per_s',num(c.per_s)); cell(tr,'burst',num(c.burst));
        cell(tr,'credit_level',num(c.level),null,c.burst?bar(c.level,c.burst):null);
        cell(tr,'credit_outstanding',num(c.outstanding),null,
          c.burst?bar(c.outstanding,c.burst):null);
        return tr;});}));
}
"""


def _page(title: str, source: str, body: str, js: str) -> bytes:
    return (
        '<!doctype html>\n<html><head><meta charset="utf-8"><title>'
        + title
        + "</title><style>"
        + _STYLE
        + "</style></head><body>"
        + body
        + "<script>\nconst SOURCE="
        + repr(source)
        + ";const REFRESH_MS="
        + str(REFRESH_MS)
        + ";\n"
        + _FRAME_JS
        + js
        + "tick();\n</script></body></html>\n"
    ).encode()


def node_page() -> bytes:
    """A mesh node's page: per limit, admitted against the limit and excess against the
    bound; the tenants served under a default policy; suspensions with their reasons, the
    key's owner and whether it is reachable; members, their reachability from this one,
    and the generations enforced."""
    return _page("ratemesh node", "/health", _NODE_BODY, _NODE_JS)


def governord_page() -> bytes:
    """governord's page: its role, leader, store and writer health (from /health); the tree
    (root, tenants, their tasks) with used against cap, leases held against limit, and each
    rated node's rate, credit level and outstanding credit (both against its burst); and
    the mesh policies it serves."""
    return _page("governord", "/ui/status", _GOVERNORD_BODY, _GOVERNORD_JS)

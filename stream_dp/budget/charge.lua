#!lua
-- Atomic, idempotent check-and-charge of a batch of privacy units.
-- Implements NamespaceLedger.charge_unit (stream_dp/budget/ledger.py) on the
-- storage layout of stream_dp/budget/layout.py; see stream_dp/budget/__init__.py
-- for the rule and its proof.
--
-- KEYS[1] charge record (hash: d digest, c charged, x excluded positions,
--         h refusals per horizon, a alerts, e expiry); KEYS[2] top-units sorted set;
-- KEYS[3] the namespace's layout fingerprint.
-- Unit states are fields of the shard hashes ARGV[8] .. generation .. ':' .. shard.
-- Unit ids come packed in ARGV[9] (each followed by one separator byte), sorted
-- by shard, with their byte lengths in ARGV[10] (uint32 LE); ARGV[11] lists the
-- shards present (uint16 LE) and ARGV[12] how many units each has (uint32 LE).
--
-- All reads and decisions happen before the first write, so an error leaves
-- nothing half-charged; the "#!lua" shebang makes Redis refuse the whole
-- script up front when it is out of memory.
--
-- Reply: {0, now, charged, excluded, refusals, histogram, spent_sums, alerts}
--        {1, now, charged, excluded, refusals, alerts}     (replay)
--        {-1, now} event time too old, {-2, now} too far ahead, {-3, now} conflict,
--        {-4, now, stored layout} another layout is in use.
-- excluded: uint32 positions (0-based); alerts: packed
-- '<I4BBBBdd' (position, horizon, old level, new level, refused, spent, lapse_ms).

local STRIDE = 8
local CHUNK = 3000
-- Every shard hash holds a field "" (no unit id is empty) with a value longer
-- than hash-max-listpack-value, so Redis keeps shards as real hash tables:
-- in listpack encoding each field lookup would scan the whole shard.
local MARKER = string.rep('-', 80)
-- Locals: global lookups cost a table access each in Redis' Lua 5.1.
local spack, sunpack, ssub, floor, ceil, unpack = struct.pack, struct.unpack, string.sub, math.floor, math.ceil, unpack
local max, min, sbyte = math.max, math.min, string.byte
local rcall = redis.call

local now = tonumber(ARGV[1])
if not now then
  local t = rcall('TIME')
  now = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
end
-- ARGV[2]: the cost per limit in fixed-point units: one number for all, or a
-- comma list (epsilon and delta limits charge different amounts).
local cost_arg = ARGV[2]
local time_ms = tonumber(ARGV[3])
local max_delay = tonumber(ARGV[4])
local max_lead = tonumber(ARGV[5])
local record_ttl = tonumber(ARGV[6])
local digest = ARGV[7]
local shard_prefix = ARGV[8]
local blob, lens, group_shards, group_sizes = ARGV[9], ARGV[10], ARGV[11], ARGV[12]
local n = tonumber(ARGV[13])
local E = tonumber(ARGV[14])
local m = tonumber(ARGV[15])
local nlevels = tonumber(ARGV[16])
local nedges = tonumber(ARGV[17])
local top_capacity = tonumber(ARGV[18])
local top_min = tonumber(ARGV[19])
local top_deadline = tonumber(ARGV[20])
local fingerprint = ARGV[21]
local record_key, top_key, meta_key = KEYS[1], KEYS[2], KEYS[3]

-- Every writer of the namespace must share one layout (see layout.py).
local stored_layout = rcall('GET', meta_key)
if not stored_layout then
  rcall('SET', meta_key, fingerprint)
elseif stored_layout ~= fingerprint then
  return {-4, now, stored_layout}
end

-- The record's own expiry 'e' (store clock) decides, so that a record outlived
-- by its key under a test clock behaves as expired all the same.
local rec = rcall('HMGET', record_key, 'd', 'c', 'x', 'h', 'a', 'e')
if rec[1] and tonumber(rec[6]) > now then
  if rec[1] ~= digest then return {-3, now} end
  local refusals = {}
  for v in string.gmatch(rec[4], '[^,]+') do refusals[#refusals + 1] = tonumber(v) end
  return {1, now, tonumber(rec[2]), rec[3], refusals, rec[5]}
end
if time_ms < now - max_delay then return {-1, now} end
if time_ms > now + max_lead then return {-2, now} end

local g = floor(now / E)
local gen_start, prev_start = g * E, (g - 1) * E
local cur_prefix = shard_prefix .. string.format('%d', g) .. ':'
local prev_prefix = shard_prefix .. string.format('%d', g - 1) .. ':'

local H, NB, W, LIM, THR, EDGE, BUCKET, BASE_CUR, BASE_PREV, COST = {}, {}, {}, {}, {}, {}, {}, {}, {}, {}
local COST_LIST = {}
for v in string.gmatch(cost_arg, '[^,]+') do COST_LIST[#COST_LIST + 1] = tonumber(v) end
local pos = 22
for i = 1, m do
  H[i] = tonumber(ARGV[pos]); NB[i] = tonumber(ARGV[pos + 1])
  W[i] = tonumber(ARGV[pos + 2]); LIM[i] = tonumber(ARGV[pos + 3])
  pos = pos + 4
  THR[i] = {}
  for k = 1, nlevels do THR[i][k] = tonumber(ARGV[pos]); pos = pos + 1 end
  EDGE[i] = {}
  for e = 1, nedges do EDGE[i][e] = tonumber(ARGV[pos]); pos = pos + 1 end
  BUCKET[i] = floor(time_ms / W[i])
  COST[i] = COST_LIST[i] or COST_LIST[1]
  BASE_CUR[i] = floor((g - 2) * E / W[i])
  BASE_PREV[i] = floor((g - 3) * E / W[i])
end

-- Counters take 3 bytes unless a limit reaches 2^24 micro-units (layout.py).
local WIDE = false
for i = 1, m do if LIM[i] >= 16777216 then WIDE = true end end
local COUNTER = 'I3'
if WIDE then COUNTER = 'I4' end

-- unpack format of a state with nlev levels and n counters, cached.
local STATE_FMT = {}
local function state_format(nlev, n)
  local byn = STATE_FMT[nlev]
  if not byn then byn = {}; STATE_FMT[nlev] = byn end
  local f = byn[n]
  if not f then f = '<B' .. string.rep('I4', nlev) .. string.rep('iH', m) .. string.rep(COUNTER, n); byn[n] = f end
  return f
end
local POPCOUNT = {[0] = 0}
for v = 1, 127 do POPCOUNT[v] = POPCOUNT[floor(v / 2)] + v % 2 end
local BIT = {1, 2, 4, 8, 16, 32, 64}

-- Scratch state of the unit being decided, per horizon i: counters in table
-- HT[i] at indices HLO[i]..HHI[i], index k holding bucket HF[i] + k (horizons
-- may share one table until one of them changes shape); alert level LV[i]
-- valid until LL[i].
local HT, HF, HLO, HHI, LV, LL = {}, {}, {}, {}, {}, {}
local EMPTY = {}

-- Bucket b of horizon i is alive (some admissible charge may read it) while
-- (b + 1) * W + H + max_delay > now, i.e. for b >= ALIVE_FROM[i].
local ALIVE_FROM = {}
for i = 1, m do ALIVE_FROM[i] = floor((now - H[i] - max_delay) / W[i]) end

local function clear()
  for i = 1, m do HT[i] = EMPTY; HF[i] = 0; HLO[i] = 1; HHI[i] = 0; LV[i] = 0; LL[i] = 0 end
end

-- Load a packed state (layout.py); returns true if something was pruned.
-- Its length tells how many counters it holds, so one unpack reads it all.
local COUNTER_BYTES = 3
if WIDE then COUNTER_BYTES = 4 end
local function decode(raw, prev)
  local start, base = gen_start, BASE_CUR
  if prev then start, base = prev_start, BASE_PREV end
  local pruned = false
  local levels = sbyte(raw, 1) % 128
  local nlev = POPCOUNT[levels]
  local total = (#raw - 1 - 4 * nlev - 6 * m) / COUNTER_BYTES
  local v = {sunpack(state_format(nlev, total), raw)}
  local h = 2
  for i = 1, m do
    LV[i] = 0; LL[i] = 0
    if levels > 0 and levels % (BIT[i] * 2) >= BIT[i] then
      local val = v[h]
      h = h + 1
      local lvl = val % STRIDE
      local lapse = start + (val - lvl) / STRIDE * 1000
      if lapse > now then LV[i] = lvl; LL[i] = lapse else pruned = true end
    end
  end
  local offset = h + 2 * m - 1
  for i = 1, m do
    local first, count = v[h], v[h + 1]
    h = h + 2
    if count == 0 then
      HT[i] = EMPTY; HF[i] = 0; HLO[i] = 1; HHI[i] = 0
    else
      local f = first + base[i] - offset - 1
      local lo = offset + 1
      if f + lo < ALIVE_FROM[i] then lo = ALIVE_FROM[i] - f; pruned = true end
      if lo > offset + count then
        HT[i] = EMPTY; HF[i] = 0; HLO[i] = 1; HHI[i] = 0
      else
        HT[i] = v; HF[i] = f; HLO[i] = lo; HHI[i] = offset + count
      end
    end
    offset = offset + count
  end
  return pruned
end

-- Pack the scratch state for the current generation (same bytes as layout.py).
local ARGS = {}
local function encode()
  local args, flags, nlev = ARGS, 0, 0
  local n = 1
  for i = 1, m do
    if LV[i] > 0 then
      flags = flags + BIT[i]
      nlev = nlev + 1
      n = n + 1
      args[n] = (LL[i] - gen_start) / 1000 * STRIDE + LV[i]
    end
  end
  local total = 0
  for i = 1, m do
    local t, lo, hi = HT[i], HLO[i], HHI[i]
    while lo <= hi and t[lo] == 0 do lo = lo + 1 end
    while hi >= lo and t[hi] == 0 do hi = hi - 1 end
    HLO[i] = lo; HHI[i] = hi
    if lo <= hi then
      args[n + 1] = HF[i] + lo - BASE_CUR[i]
      args[n + 2] = hi - lo + 1
      total = total + hi - lo + 1
    else
      args[n + 1] = 0; args[n + 2] = 0
    end
    n = n + 2
  end
  if total == 0 and nlev == 0 then return '' end
  for i = 1, m do
    local t = HT[i]
    for k = HLO[i], HHI[i] do n = n + 1; args[n] = t[k] end
  end
  if WIDE then flags = flags + 128 end
  args[1] = flags
  return spack(state_format(nlev, total), unpack(args, 1, n))
end

-- Largest sum of a run of B + 1 buckets containing bucket b, over the live
-- buckets lb..hb (a sliding window over the runs starting in b - B .. b).
local function run_max(i)
  local lo, hi = HLO[i], HHI[i]
  if lo > hi then return 0 end
  local t, f = HT[i], HF[i]
  local b, B = BUCKET[i], NB[i]
  local lb, hb = f + lo, f + hi
  if lb > b + B or hb < b - B then return 0 end
  local sum = 0
  if hb <= b then
    -- Nothing after b: the first run, b - B .. b, holds everything the others do.
    for k = max(lb, b - B) - f, hi do sum = sum + t[k] end
    return sum
  end
  for k = max(lb, b - B) - f, min(hb, b) - f do sum = sum + t[k] end
  local best = sum
  for s = max(b - B + 1, lb - B), min(b, hb + 1) do
    local add, rem = s + B, s - 1
    if add >= lb and add <= hb then sum = sum + t[add - f] end
    if rem >= lb and rem <= hb then sum = sum - t[rem - f] end
    if sum > best then best = sum end
  end
  return best
end

-- Add the charge to bucket b; a horizon that changes shape gets its own table.
-- A zero cost (the delta limit of a pure-epsilon query) writes nothing.
local function add_cost(i)
  local cost = COST[i]
  if cost == 0 then return end
  local b, lo, hi = BUCKET[i], HLO[i], HHI[i]
  if lo > hi then
    HT[i] = {cost}; HF[i] = b - 1; HLO[i] = 1; HHI[i] = 1
    return
  end
  local t, f = HT[i], HF[i]
  local k = b - f
  if k >= lo and k <= hi then
    t[k] = t[k] + cost
    return
  end
  if k > hi then
    -- Past the end (the usual case: time moves on): copy, pad with zeros, append.
    local nt = {unpack(t, lo, hi)}
    local n = hi - lo + 1
    for j = n + 1, k - lo do nt[j] = 0 end
    nt[k - lo + 1] = cost
    HT[i] = nt; HF[i] = f + lo - 1; HLO[i] = 1; HHI[i] = k - lo + 1
    return
  end
  -- Before the first live bucket (a late window).
  local nt = {cost}
  for j = b + 1, f + lo - 1 do nt[j - b + 1] = 0 end
  for j = lo, hi do nt[f + j - b + 1] = t[j] end
  HT[i] = nt; HF[i] = b - 1; HLO[i] = 1; HHI[i] = f + hi - b + 1
end

-- Unpack the batch. Units arrive sorted by shard: run k, units
-- GROUP_FIRST[k] .. GROUP_LAST[k], all belong to shard GROUP_SHARD[k].
local units = {}
local off, lpos = 1, 1
for u = 1, n do
  local len
  len, lpos = sunpack('<I4', lens, lpos)
  units[u] = ssub(blob, off, off + len - 1)
  off = off + len + 1
end
local ngroups = #group_shards / 2
local GROUP_SHARD, GROUP_FIRST, GROUP_LAST = {}, {}, {}
do
  local first, gpos, cpos = 1, 1, 1
  for k = 1, ngroups do
    local shard, size
    shard, gpos = sunpack('<I2', group_shards, gpos)
    size, cpos = sunpack('<I4', group_sizes, cpos)
    GROUP_SHARD[k] = shard; GROUP_FIRST[k] = first; GROUP_LAST[k] = first + size - 1
    first = first + size
  end
end

-- Phase 1a: read every state (current generation, else the previous one).
local raw_state, from_prev, has_marker = {}, {}, {}
for k = 1, ngroups do
  local shard = GROUP_SHARD[k]
  for c0 = GROUP_FIRST[k], GROUP_LAST[k], CHUNK do
    local c1 = math.min(c0 + CHUNK - 1, GROUP_LAST[k])
    local vals = rcall('HMGET', cur_prefix .. shard, '', unpack(units, c0, c1))
    if vals[1] then has_marker[k] = true end
    local missing, missing_names = {}, {}
    for j = c0, c1 do
      local v = vals[j - c0 + 2]
      if v then raw_state[j] = v
      else missing[#missing + 1] = j; missing_names[#missing_names + 1] = units[j] end
    end
    if #missing > 0 then
      vals = rcall('HMGET', prev_prefix .. shard, unpack(missing_names))
      for j = 1, #missing do
        local v = vals[j]
        if v then raw_state[missing[j]] = v; from_prev[missing[j]] = true end
      end
    end
  end
end

-- Phase 1b: decide every unit.
local new_state = {}
local charged = 0
local excluded_parts, alert_parts, top_args = {}, {}, {}
local refusals, hist, sums = {}, {}, {}
for i = 1, m do
  refusals[i] = 0; sums[i] = 0
  for e = 1, nedges + 1 do hist[(i - 1) * (nedges + 1) + e] = 0 end
end
local spent, refused = {}, {}
local top_floor = -1
if top_capacity > 0 and rcall('ZCARD', top_key) >= top_capacity then
  local lowest = rcall('ZRANGE', top_key, 0, 0, 'WITHSCORES')
  if lowest[2] then top_floor = tonumber(lowest[2]) end
end

-- Decide the unit whose state is in the scratch tables. The outcome depends
-- on nothing but that state, so it is returned as a record that can be
-- applied to every unit with the same stored state:
--   {new state or false, admitted, top score, alert tails or false,
--    spent[1..m], refused[1..m] (1/0), histogram slot[1..m]}
local function decide(dirty)
  -- (sized for 7 horizons up front: growing a table rehashes it)
  local rec = {false, true, 0, false, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
  local ok = true
  for i = 1, m do
    local best = run_max(i)
    spent[i] = best
    local r = best + COST[i] > LIM[i]
    refused[i] = r
    if r then ok = false end
  end
  if ok then
    dirty = true
    for i = 1, m do add_cost(i); spent[i] = spent[i] + COST[i] end
  end
  rec[2] = ok
  local score, tails = 0, false
  for i = 1, m do
    local sp = spent[i]
    local level = 0
    local thr = THR[i]
    if refused[i] then
      level = nlevels
    elseif nlevels > 0 and sp >= thr[1] then
      for k = 1, nlevels do if sp >= thr[k] then level = k end end
    end
    if level > LV[i] then
      local old_level, lapse = LV[i], LL[i]
      if old_level == 0 then lapse = ceil((now + H[i]) / 1000) * 1000 end
      LV[i] = level; LL[i] = lapse
      dirty = true
      local was_refused = 0
      if refused[i] then was_refused = 1 end
      tails = tails or {}
      tails[#tails + 1] = spack('<BBBBdd', i - 1, old_level, level, was_refused, sp, lapse)
    end
    rec[4 + i] = sp
    rec[4 + m + i] = refused[i] and 1 or 0
    if nedges > 0 then
      local edges, e = EDGE[i], nedges + 1
      for k = 1, nedges do
        if sp <= edges[k] then e = k; break end
      end
      rec[4 + 2 * m + i] = (i - 1) * (nedges + 1) + e
    end
    local fr = sp / LIM[i]
    if fr > score then score = fr end
  end
  rec[3] = score
  rec[4] = tails
  if dirty then rec[1] = encode() end
  return rec
end

local function apply(u, rec)
  new_state[u] = rec[1]
  if rec[2] then
    charged = charged + 1
  else
    excluded_parts[#excluded_parts + 1] = spack('<I4', u - 1)
    for i = 1, m do refusals[i] = refusals[i] + rec[4 + m + i] end
  end
  local tails = rec[4]
  if tails then
    local position = spack('<I4', u - 1)
    for k = 1, #tails do alert_parts[#alert_parts + 1] = position .. tails[k] end
  end
  if nedges > 0 then
    for i = 1, m do
      local slot = rec[4 + 2 * m + i]
      hist[slot] = hist[slot] + 1
      sums[i] = sums[i] + rec[4 + i]
    end
  end
  local score = rec[3]
  if top_capacity > 0 and score >= top_min and score > top_floor then
    top_args[#top_args + 1] = score
    top_args[#top_args + 1] = units[u]
  end
end

-- Units with the same stored state (often: none yet) get the same decision.
local MEMO = {}
for u = 1, n do
  local raw = raw_state[u]
  local prev = from_prev[u]
  local rec = nil
  if not prev then rec = MEMO[raw or ''] end
  if not rec then
    local dirty = false
    if raw then dirty = decode(raw, prev) or prev == true else clear() end
    rec = decide(dirty)
    if not prev then MEMO[raw or ''] = rec end
  end
  apply(u, rec)
end

-- Phase 2: write.
local ttl = (g + 2) * E - now
for k = 1, ngroups do
  local sets, dels_cur, dels_prev = {}, {}, {}
  if not has_marker[k] then sets[1] = ''; sets[2] = MARKER end
  for u = GROUP_FIRST[k], GROUP_LAST[k] do
    local st = new_state[u]
    if st then
      if st ~= '' then
        sets[#sets + 1] = units[u]; sets[#sets + 1] = st
      elseif not from_prev[u] then
        dels_cur[#dels_cur + 1] = units[u]
      end
    end
    if from_prev[u] then dels_prev[#dels_prev + 1] = units[u] end
  end
  local cur_key = cur_prefix .. GROUP_SHARD[k]
  if #sets > 2 or (#sets > 0 and has_marker[k]) then
    for c0 = 1, #sets, 2 * CHUNK do
      rcall('HSET', cur_key, unpack(sets, c0, math.min(c0 + 2 * CHUNK - 1, #sets)))
    end
    rcall('PEXPIRE', cur_key, ttl)
  end
  for c0 = 1, #dels_cur, CHUNK do
    rcall('HDEL', cur_key, unpack(dels_cur, c0, math.min(c0 + CHUNK - 1, #dels_cur)))
  end
  for c0 = 1, #dels_prev, CHUNK do
    rcall('HDEL', prev_prefix .. GROUP_SHARD[k], unpack(dels_prev, c0, math.min(c0 + CHUNK - 1, #dels_prev)))
  end
end

-- Top units: at or above top_min, and above the current minimum once full.
if #top_args > 0 then
  for c0 = 1, #top_args, 2 * CHUNK do
    rcall('ZADD', top_key, 'GT', unpack(top_args, c0, math.min(c0 + 2 * CHUNK - 1, #top_args)))
  end
  local size = rcall('ZCARD', top_key)
  if size > top_capacity then
    rcall('ZREMRANGEBYRANK', top_key, 0, size - top_capacity - 1)
  end
  rcall('PEXPIRE', top_key, math.max(top_deadline - now, 1000))
end

local excluded = table.concat(excluded_parts)
local alerts = table.concat(alert_parts)
rcall('HSET', record_key, 'd', digest, 'c', charged, 'x', excluded, 'h', table.concat(refusals, ','), 'a', alerts,
  'e', now + record_ttl)
rcall('PEXPIRE', record_key, record_ttl)
return {0, now, charged, excluded, refusals, hist, sums, alerts}

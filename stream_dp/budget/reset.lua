#!lua
-- Forget one unit's spending (an administrative override): delete its state
-- from the generations around the store clock and drop it from the top sets.
-- ARGV: now ("" for the server clock), shard key prefix, generation ms,
-- shard, unit id, top period ms, top key prefix. Returns the states deleted.

local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local shard_prefix, E, shard, unit = ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
local period_ms, top_prefix = tonumber(ARGV[6]), ARGV[7]

local g = math.floor(now / E)
local removed = 0
for d = -1, 1 do
  removed = removed + redis.call('HDEL', shard_prefix .. string.format('%d', g + d) .. ':' .. shard, unit)
end
local p = math.floor(now / period_ms)
for d = -2, 1 do
  redis.call('ZREM', top_prefix .. string.format('%d', p + d), unit)
end
return removed

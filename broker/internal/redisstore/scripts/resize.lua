-- resize.lua changes the slice of a running server in place, on the GPU it
-- already holds: capacity and quota checks for the growth, the allocation,
-- the GPU's and the subjects' counters, the indexes, the server record and
-- an event, in one atomic step.
--
-- KEYS[1] allocs (hash slice id → allocation JSON)
-- KEYS[2] usage (hash of user and group counters)
-- KEYS[3] server record, KEYS[4] its event stream
-- KEYS[5] marker (string; a growth is refused while it is absent: the
--         allocations are being rebuilt and the GPU's counters may lack
--         slices of pods not restored yet)
-- ARGV[1] gpu key prefix
-- ARGV[2] spawn id (= slice id) the caller acts for
-- ARGV[3] new memory MiB, ARGV[4] new compute percent, ARGV[5] new compute
--         limit percent
-- ARGV[6] the record's new slice JSON, ARGV[7] the record's new alloc JSON
-- ARGV[8] event message, ARGV[9] now (Unix ns), ARGV[10] event MAXLEN,
-- ARGV[11] event TTL ms
-- ARGV[12] k, then k quota caps: scope ("user"/"group"), name, memory MiB,
--          compute percent (0 = none); a charged subject without caps is
--          not limited
-- ARGV[13+4k] "undo" or absent; with "undo", ARGV[14+4k..16+4k] are the
--          memory MiB, compute percent and compute limit percent the
--          allocation must hold now (the slice a failed resize stored).
--          An undo puts back the slice the pod still records, so it is not
--          checked against room, quotas or the marker: the GPU's and the
--          subjects' counters return to what the pod's slice charges
-- Returns one of
--   {"resized", HGETALL}   the slice changed; event appended
--   {"same", HGETALL}      the slice already was the asked one; nothing written
--   {"moved"}              an undo found another slice than the one it
--                          undoes (a later resize changed it); nothing written
--   {"notfound"}           no such server
--   {"spawn", current}     the caller's spawn is not the current one
--   {"state", current}     the server is not running
--   {"noalloc"}            the spawn holds no allocation
--   {"notready"}           a growth while the marker is missing
--   {"corrupt", why}       the stored allocation cannot be rewritten
--   {"mode", mode}         the device is not time-sliced: a slice of this
--                          mode cannot change in place
--   {"gpu", uuid, node, free MiB, free compute, healthy "1"/"0"}
--                          the GPU lacks room for the growth (free counts
--                          exclude this slice)
--   {"quota", scope, name, resource, limit, used, want}

if redis.call('EXISTS', KEYS[3]) == 0 then
  return {'notfound'}
end
local spawn = ARGV[2]
local cur = redis.call('HMGET', KEYS[3], 'spawn', 'state')
if cur[1] ~= spawn then
  return {'spawn', cur[1]}
end
if cur[2] ~= 'running' then
  return {'state', cur[2]}
end
local rec = redis.call('HGET', KEYS[1], spawn)
if not rec then
  return {'noalloc'}
end
local a = cjson.decode(rec)
local mem, cp, cl = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local k = tonumber(ARGV[12])
local undo = ARGV[13 + 4 * k] == 'undo'
if undo and (a.memoryMiB ~= tonumber(ARGV[14 + 4 * k]) or a.computePercent ~= tonumber(ARGV[15 + 4 * k]) or
    a.computeLimitPercent ~= tonumber(ARGV[16 + 4 * k])) then
  return {'moved'}
end
if a.memoryMiB == mem and a.computePercent == cp and a.computeLimitPercent == cl then
  return {'same', redis.call('HGETALL', KEYS[3])}
end
local dm = mem - a.memoryMiB
local dc = cp - a.computePercent

-- The GPU: the growth must fit next to the other slices.
local gkey = ARGV[1] .. a.gpu
local g = gpu_load(gkey)
if not g then
  return {'corrupt', 'gpu ' .. a.gpu .. ' is not registered'}
end
if g.mode ~= 'sliced' or (a.sharing and a.sharing ~= 'sliced') then
  return {'mode', a.sharing or g.mode}
end
local grows = not undo and (dm > 0 or dc > 0)
if grows and redis.call('EXISTS', KEYS[5]) == 0 then
  return {'notready'}
end
if grows and (not g.healthy or g.amem + dm > g.mem or g.acp + dc > 100) then
  local node = redis.call('HGET', gkey, 'node') or ''
  return {'gpu', a.gpu, node, tostring(g.mem - g.amem + a.memoryMiB), tostring(100 - g.acp + a.computePercent),
    g.healthy and '1' or '0'}
end

-- Quotas: the subjects the allocation charges, user first.
local caps = {}
for i = 1, k do
  local base = 13 + 4 * (i - 1)
  caps[ARGV[base] .. ':' .. ARGV[base + 1]] = {tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3])}
end
local prefixes = {USER_FIELD .. a.user}
local subjects = {{'user', a.user}}
for _, grp in ipairs(a.groups) do
  prefixes[#prefixes + 1] = GROUP_FIELD .. grp
  subjects[#subjects + 1] = {'group', grp}
end
local used = usage_load(KEYS[2], prefixes)
for i, sub in ipairs(subjects) do
  local c = caps[sub[1] .. ':' .. sub[2]]
  if c and not undo then
    if dm > 0 and c[1] > 0 and used[i][2] + dm > c[1] then
      return {'quota', sub[1], sub[2], 'memoryMiB', tostring(c[1]), tostring(used[i][2]), tostring(dm)}
    end
    if dc > 0 and c[2] > 0 and used[i][3] + dc > c[2] then
      return {'quota', sub[1], sub[2], 'computePercent', tostring(c[2]), tostring(used[i][3]), tostring(dc)}
    end
  end
end

-- Rewrite the allocation's slice fields; the rest of the record (user,
-- groups, GPU) is kept byte for byte. Inside a JSON string every quote is
-- escaped, so the pattern can only match the members themselves.
local nrec, n = string.gsub(rec,
  '"memoryMiB":%-?%d+,"computePercent":%-?%d+,"computeLimitPercent":%-?%d+,"gpu":',
  '"memoryMiB":' .. string.format('%d', mem) .. ',"computePercent":' .. string.format('%d', cp) ..
  ',"computeLimitPercent":' .. string.format('%d', cl) .. ',"gpu":')
if n ~= 1 then
  return {'corrupt', 'allocation record has ' .. n .. ' slice members'}
end

local was = gpu_class(g)
g.amem = g.amem + dm
g.acp = g.acp + dc
gpu_store(gkey, g)
gpu_index(g, a.gpu, was)
for _, u in ipairs(used) do
  u[2] = u[2] + dm
  u[3] = u[3] + dc
end
usage_store(KEYS[2], prefixes, used)
redis.call('HSET', KEYS[1], spawn, nrec)

redis.call('HSET', KEYS[3], 'slice', ARGV[6], 'alloc', ARGV[7], 'msg', ARGV[8], 'updated', ARGV[9])
append_event(KEYS[4], spawn, 'running', ARGV[8], ARGV[9], ARGV[10], ARGV[11])
return {'resized', redis.call('HGETALL', KEYS[3])}

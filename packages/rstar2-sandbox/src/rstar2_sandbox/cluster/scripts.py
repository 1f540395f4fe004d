"""Lua scripts that make each multi-step Redis operation of the cluster one atomic step."""

# Refuses the call when max_queue calls already wait (queued, not yet handed to a worker): the
# bound and the append are one atomic step, so concurrent front ends cannot overshoot it together.
# KEYS: stream. ARGV: group, max_queue, request id, reply-to, request JSON.
ENQUEUE = """
local held = redis.call('XPENDING', KEYS[1], ARGV[1])[1]
if redis.call('XLEN', KEYS[1]) - held >= tonumber(ARGV[2]) then return false end
return redis.call('XADD', KEYS[1], '*', 'id', ARGV[3], 'reply', ARGV[4], 'request', ARGV[5])
"""

# First writer wins: only the call's first result reaches its front end. The entry is removed
# from the stream either way, since the call is done.
# KEYS: done marker, reply list, stream. ARGV: marker, result JSON, ttl ms, group, entry id.
COMPLETE = """
local written = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[3])
if written then
  redis.call('RPUSH', KEYS[2], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
redis.call('XACK', KEYS[3], ARGV[4], ARGV[5])
redis.call('XDEL', KEYS[3], ARGV[5])
if written then return 1 end
return 0
"""

# A worker's heartbeat scores it with the time its lease expires, on the Redis server's clock:
# nodes with skewed clocks agree, and front ends need not know the workers' lease. Workers
# silent for an hour are forgotten.
# KEYS: workers zset, info hash. ARGV: worker id, lease ms, info JSON.
HEARTBEAT = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZADD', KEYS[1], ms + tonumber(ARGV[2]), ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ms - 3600000)
for _, id in ipairs(dead) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
end
return ms
"""

# Deletes consumers that hold nothing and have not touched the stream for ARGV[2] ms: workers
# that died (after their calls were reclaimed) or stopped. Check and delete are one atomic step,
# so a consumer cannot take a call between them.
# KEYS: stream. ARGV: group, min idle ms.
PRUNE_CONSUMERS = """
local pruned = 0
for _, consumer in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local info = {}
  for i = 1, #consumer, 2 do info[consumer[i]] = consumer[i + 1] end
  if tonumber(info['pending']) == 0 and tonumber(info['idle']) > tonumber(ARGV[2]) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], info['name'])
    pruned = pruned + 1
  end
end
return pruned
"""

# What the live workers reported in their last heartbeat ('{}' where missing).
# KEYS: workers zset, info hash.
LIVE_WORKERS = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local live = redis.call('ZRANGEBYSCORE', KEYS[1], ms, '+inf')
local infos = {}
for i, id in ipairs(live) do
  infos[i] = redis.call('HGET', KEYS[2], id) or '{}'
end
return infos
"""

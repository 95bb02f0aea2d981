-- wrk script of bench/bench_leases.py: the data plane's lease traffic, one state machine per
-- wrk thread (the bench runs one connection per thread, so a thread's state is its client's).
--
--   wrk -t N -c N -d 20s -s bench/leases.lua http://127.0.0.1:PORT -- \
--       SECRET ORGS MODE [DELAY_MS] [ORG_PREFIX] [BUSY_ORG] [BUSY_SHARE]
--
-- MODE: "livez" (GET /livez, the framework floor), "grant_release" (grant, then release it),
-- "mix" (grant, renew, release). A grant that is refused (429 cap reached, 503 resharding)
-- is followed by another grant. DELAY_MS is a think time before each request (0: closed loop
-- at full speed), which sets the offered rate of the "70 % of the maximum rate" runs.
-- BUSY_ORG / BUSY_SHARE: that org gets BUSY_SHARE percent of the grants (the storm's busy org).
-- done() prints one "STAT <kind> <status> <count>" line per kind and status, then the
-- latency percentiles ("LAT p50 <us>" ...), for the bench to parse.

local threads = {}

function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  secret = args[1]
  orgs = tonumber(args[2] or "1000")
  mode = args[3] or "grant_release"
  think = tonumber(args[4] or "0")
  prefix = args[5] or "org-"
  busy = args[6] or ""
  busy_share = tonumber(args[7] or "0")
  math.randomseed(tid * 7919 + os.time())
  stats = {}
  step = "grant"
  kind = "grant"
  lease = nil
  org = nil
  json = { ["Content-Type"] = "application/json", ["X-Duckgres-Dataplane-Secret"] = secret }
  plain = { ["X-Duckgres-Dataplane-Secret"] = secret }
  holder = string.format("wrk-%d", tid)
  grant_body = '{"holder": "' .. holder .. '", "purpose": "query", "ttl_seconds": 60}'
end

function delay()
  return think
end

local function pick_org()
  if busy ~= "" and math.random(100) <= busy_share then
    return busy
  end
  return string.format("%s%04d", prefix, math.random(0, orgs - 1))
end

function request()
  if mode == "livez" then
    kind = "livez"
    return wrk.format("GET", "/livez")
  end
  local base
  if step == "grant" then
    kind = "grant"
    org = pick_org()
    return wrk.format("POST", "/api/v1/warehouses/" .. org .. "/leases", json, grant_body)
  end
  base = "/api/v1/warehouses/" .. org .. "/leases/" .. lease
  if step == "renew" then
    kind = "renew"
    return wrk.format("POST", base .. "/renew", json, '{"ttl_seconds": 60}')
  end
  kind = "release"
  return wrk.format("DELETE", base, plain)
end

function response(status, headers, body)
  local key = kind .. " " .. status
  stats[key] = (stats[key] or 0) + 1
  if kind == "livez" then
    return
  end
  if kind == "grant" then
    if status == 201 then
      lease = string.match(body, '"lease_id":%s*(%d+)')
      step = (mode == "mix") and "renew" or "release"
    else
      step = "grant"
    end
  elseif kind == "renew" then
    step = "release"
  else
    step = "grant"
  end
end

function done(summary, latency, requests)
  local total = {}
  for _, thread in ipairs(threads) do
    local s = thread:get("stats")
    for key, count in pairs(s) do
      total[key] = (total[key] or 0) + count
    end
  end
  for key, count in pairs(total) do
    io.write(string.format("STAT %s %d\n", key, count))
  end
  for _, p in ipairs({ 50, 90, 99 }) do
    io.write(string.format("LAT p%d %d\n", p, latency:percentile(p)))
  end
  io.write(string.format("LAT max %d\n", latency.max))
  io.write(string.format("LAT mean %d\n", math.floor(latency.mean)))
  io.write(string.format("SUMMARY requests %d duration_us %d errors_connect %d errors_read %d "
    .. "errors_write %d errors_timeout %d errors_status %d\n", summary.requests, summary.duration,
    summary.errors.connect, summary.errors.read, summary.errors.write, summary.errors.timeout,
    summary.errors.status))
end

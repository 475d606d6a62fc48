-- wrk hook: print the run's figures as one JSON line, so nothing is parsed from wrk's
-- human-readable report. Latencies are in microseconds, as wrk records them.

-- Status classes (2xx, 3xx, 4xx, 5xx) of the answers, beside wrk's own error counts.
-- setup() runs in the main Lua state (the one done() runs in) once per wrk thread: it keeps
-- the thread, so done() can read that thread's counts with thread:get (which reads globals
-- of the thread's own Lua state). A script's own setup() and response() still run: they are
-- chained. Cost: with response() defined, wrk copies every answer's headers and body into Lua.
-- Measured (wrk -t1 -c16 on nginx static files, 2 cores, 6 interleaved 4-s runs, two sessions):
-- wrk CPU per request +1.3-1.4 us (+8-10%) for a 612-byte file, +3.5-4.9 us (+16-28%) for a
-- 16 KB one; the rate nginx reached moved within the noise (medians -6%..+6%). At an app's rates
-- (a few thousand requests/s) that is under 2% of one core.
local status_threads = {}
local status_script_setup = setup
setup = function(thread)
  status_threads[#status_threads + 1] = thread
  if status_script_setup then status_script_setup(thread) end
end

status_counts = {0, 0, 0, 0, 0}  -- per thread, indexed by status // 100

-- Answers per worker pid, from the demo app's X-Worker-Pid header: the per-worker counts of a
-- server without a stats server (gunicorn, granian), mapped to worker numbers by bench.observe.
-- Two spellings: servers pass the app's header on as written, or lowercased (granian's hyper);
-- wrk keeps the name as received. An app without the header counts nothing. At most
-- WORKER_PIDS_MAX distinct pids per thread, digits only, so the JSON line stays small and valid.
-- Cost, on top of the response() hook above (measured with scripts/header-cost.py, README
-- "Against the alternatives"): two table lookups and an increment per answer.
WORKER_PIDS_MAX = 256
worker_pid_counts = {}  -- per thread: pid (a string of digits) -> answers
local worker_pid_distinct = 0

local function count_worker_pid(headers)
  local pid = headers["X-Worker-Pid"] or headers["x-worker-pid"]
  if pid == nil then return end
  local n = worker_pid_counts[pid]
  if n then
    worker_pid_counts[pid] = n + 1
  elseif worker_pid_distinct < WORKER_PIDS_MAX and string.find(pid, "^%d+$") then
    worker_pid_counts[pid] = 1
    worker_pid_distinct = worker_pid_distinct + 1
  end
end

-- count_worker_pids = false (set by a script before this file) turns the count off: for
-- measuring what it costs.
if count_worker_pids == false then count_worker_pid = function() end end

local status_script_response = response
if status_script_response then
  response = function(status, headers, body)
    local class = (status - status % 100) / 100
    status_counts[class] = (status_counts[class] or 0) + 1
    count_worker_pid(headers)
    status_script_response(status, headers, body)
  end
else
  response = function(status, headers)
    local class = (status - status % 100) / 100
    status_counts[class] = (status_counts[class] or 0) + 1
    count_worker_pid(headers)
  end
end

local function status_json()
  local sum = {0, 0, 0, 0, 0}
  for _, thread in ipairs(status_threads) do
    local counts = thread:get("status_counts") or {}
    for class = 1, 5 do sum[class] = sum[class] + (counts[class] or 0) end
  end
  return string.format('"status":{"2xx":%d,"3xx":%d,"4xx":%d,"5xx":%d}', sum[2], sum[3], sum[4], sum[5])
end

local function worker_pids_json()
  local sum, keys = {}, {}
  for _, thread in ipairs(status_threads) do
    for pid, n in pairs(thread:get("worker_pid_counts") or {}) do
      if sum[pid] == nil then keys[#keys + 1] = pid end
      sum[pid] = (sum[pid] or 0) + n
    end
  end
  table.sort(keys)
  local items = {}
  for i, pid in ipairs(keys) do items[i] = string.format('"%s":%d', pid, sum[pid]) end
  return '"worker_pids":{' .. table.concat(items, ",") .. '}'
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"duration_us":%d,"requests":%d,"bytes":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency_us":{"min":%d,"max":%d,"mean":%.3f,"stdev":%.3f,' ..
    '"p50":%d,"p90":%d,"p99":%d,"p999":%d},%s,%s}\n',
    summary.duration, summary.requests, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.min, latency.max, latency.mean, latency.stdev,
    latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency:percentile(99.9),
    status_json(), worker_pids_json()))
  write_latency_histogram(latency)
end

-- ---------------------------------------------------------------- latency histogram
-- A second line, WRK_HISTOGRAM {"distinct":D,"pairs":[[latency_us,count],...]}: every distinct
-- latency wrk recorded (1-us resolution) with its count, ascending. latency(i) returns the
-- i-th distinct value but finds it by scanning wrk's array from the minimum on every call
-- (wrk 4.1 src/stats.c stats_value_at), so the walk reads about D x (max - min) / 2 slots.
-- Above HISTOGRAM_BUDGET slot reads the walk is skipped ("skipped" says why) rather than
-- holding wrk for seconds after the load: the run then keeps its per-run percentiles only.
-- The pairs are exact and include wrk's coordinated-omission correction (src/wrk.c
-- stats_correct), which bench/load/wrk.py undoes.
HISTOGRAM_BUDGET = 1e9

function write_latency_histogram(latency)
  local distinct = #latency
  local reads = distinct * (latency.max - latency.min) / 2
  if distinct > 0 and reads > HISTOGRAM_BUDGET then
    io.write(string.format('WRK_HISTOGRAM {"distinct":%d,"skipped":"%d distinct values x %d us range ' ..
                           'would read %.0f slots, over the budget of %.0f"}\n',
                           distinct, distinct, latency.max - latency.min, reads, HISTOGRAM_BUDGET))
    return
  end
  local pairs = {}
  for i = 1, distinct do
    local value, count = latency(i)
    pairs[i] = string.format("[%d,%d]", value, count)
  end
  io.write(string.format('WRK_HISTOGRAM {"distinct":%d,"pairs":[%s]}\n', distinct, table.concat(pairs, ",")))
end

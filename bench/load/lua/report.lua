-- wrk hook: print the run's figures as one JSON line, so nothing is parsed from wrk's
-- human-readable report. Latencies are in microseconds, as wrk records them.
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"duration_us":%d,"requests":%d,"bytes":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency_us":{"min":%d,"max":%d,"mean":%.3f,"stdev":%.3f,' ..
    '"p50":%d,"p90":%d,"p99":%d,"p999":%d}}\n',
    summary.duration, summary.requests, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.min, latency.max, latency.mean, latency.stdev,
    latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency:percentile(99.9)))
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

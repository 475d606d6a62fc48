-- wrk script: every request asks for a random path from a list (the thread-pool article's
-- method), and done() prints the run's figures as one JSON line (report.lua, loaded below).
--
--   wrk -t2 -c50 -d10s --latency -s bench/load/lua/random_files.lua http://127.0.0.1:8000 -- LIST [SEED]
--
-- LIST: a file with one request path per line ("/files/s00042", "/static/small/00/00/s00042.bin");
-- empty lines are skipped (bench/files.py writes these lists). SEED (default 1): each wrk
-- thread seeds its generator with SEED + its thread number, so repeated runs request the
-- same sequence per connection group and runs stay comparable.

local counter = 0

-- Runs in the main Lua state once per thread, before that thread's init().
function setup(thread)
  counter = counter + 1
  thread:set("thread_no", counter)
end

local requests = {}

function init(args)
  local list = args[1]
  if list == nil or list == "" then
    error("random_files.lua: usage: wrk ... -s random_files.lua URL -- PATH_LIST_FILE [SEED]")
  end
  local seed = tonumber(args[2] or "1")
  if seed == nil then
    error("random_files.lua: SEED must be a number, got " .. tostring(args[2]))
  end
  for line in io.lines(list) do
    line = line:gsub("\r$", "")
    if line ~= "" then
      -- Pre-format every request once: no string building on the hot path.
      requests[#requests + 1] = wrk.format(nil, line)
    end
  end
  if #requests == 0 then
    error("random_files.lua: no paths in " .. list)
  end
  math.randomseed(seed + (thread_no or 0))
end

function request()
  return requests[math.random(#requests)]
end

-- The JSON done() hook lives in report.lua next to this file (unless the caller already
-- appended it to this script's text, as bench/load/wrk.py's write_script does).
if done == nil then
  local source = debug.getinfo(1, "S").source
  local dir = source:match("^@(.*/)") or "./"
  dofile(dir .. "report.lua")
end

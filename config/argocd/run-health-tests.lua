-- Runs every Argo CD health check under a resource_customizations-style folder against its
-- fixtures, with a plain Lua 5.4 interpreter (Argo CD embeds a Lua 5.1 VM; health.lua sticks to
-- the common subset).
--
--   lua5.4 config/argocd/run-health-tests.lua config/argocd
--
-- Inputs are only files: each <group>/<Kind>/health_test.yaml (Argo CD's format) and the fixtures
-- it names. Fixtures may be JSON (`kubectl get -o json`) or block-style YAML as kubectl and
-- serde_yaml write it; replacing them with recorded objects needs no change here.

local root = arg[1] or "config/argocd"

---------------------------------------------------------------------------------------------
-- A small reader for JSON and the block-style YAML subset that Kubernetes tools emit: mappings,
-- sequences (indented or not), plain, single- and double-quoted scalars, |/> block scalars,
-- flow [] and {} (JSON-like), comments, and plain scalars continued on more-indented lines.
---------------------------------------------------------------------------------------------

local function fail(msg, lineno)
  error((lineno and ("line " .. lineno .. ": ") or "") .. msg, 0)
end

-- Flow/JSON values, from position i of s; returns value, next position.
local flow
local function skip_ws(s, i)
  while true do
    local c = s:sub(i, i)
    if c == " " or c == "\t" or c == "\n" or c == "\r" then
      i = i + 1
    elseif c == "#" and (i == 1 or s:sub(i - 1, i - 1):match("%s")) then
      i = (s:find("\n", i, true) or #s) + 1
    else
      return i
    end
  end
end

local function typed_plain(text)
  if text == "true" or text == "True" or text == "TRUE" then return true end
  if text == "false" or text == "False" or text == "FALSE" then return false end
  if text == "null" or text == "Null" or text == "NULL" or text == "~" or text == "" then return nil end
  if text:match("^[-+]?%d+$") then return math.tointeger(tonumber(text)) end
  if text:match("^[-+]?%d*%.?%d+[eE]?[-+]?%d*$") and tonumber(text) then return tonumber(text) end
  return text
end

local function double_quoted(s, i) -- s:sub(i,i) == '"'
  local out, j = {}, i + 1
  while true do
    local c = s:sub(j, j)
    if c == "" then fail("unterminated double-quoted string") end
    if c == '"' then return table.concat(out), j + 1 end
    if c == "\\" then
      local e = s:sub(j + 1, j + 1)
      local map = { n = "\n", t = "\t", r = "\r", b = "\b", f = "\f", ["/"] = "/", ["\\"] = "\\", ['"'] = '"', ["0"] = "\0" }
      if map[e] then
        out[#out + 1] = map[e]; j = j + 2
      elseif e == "u" then
        out[#out + 1] = utf8.char(tonumber(s:sub(j + 2, j + 5), 16)); j = j + 6
      else
        fail("unknown escape \\" .. e)
      end
    else
      out[#out + 1] = c; j = j + 1
    end
  end
end

local function single_quoted(s, i)
  local out, j = {}, i + 1
  while true do
    local c = s:sub(j, j)
    if c == "" then fail("unterminated single-quoted string") end
    if c == "'" then
      if s:sub(j + 1, j + 1) == "'" then
        out[#out + 1] = "'"; j = j + 2
      else
        return table.concat(out), j + 1
      end
    else
      out[#out + 1] = c; j = j + 1
    end
  end
end

flow = function(s, i)
  i = skip_ws(s, i)
  local c = s:sub(i, i)
  if c == "{" then
    local t = {}
    i = skip_ws(s, i + 1)
    if s:sub(i, i) == "}" then return t, i + 1 end
    while true do
      local k
      k, i = flow(s, i)
      i = skip_ws(s, i)
      if s:sub(i, i) ~= ":" then fail("expected ':' in flow mapping") end
      local v
      v, i = flow(s, i + 1)
      t[tostring(k)] = v
      i = skip_ws(s, i)
      local d = s:sub(i, i)
      if d == "}" then return t, i + 1 end
      if d ~= "," then fail("expected ',' or '}' in flow mapping") end
      i = i + 1
    end
  elseif c == "[" then
    local t = {}
    i = skip_ws(s, i + 1)
    if s:sub(i, i) == "]" then return t, i + 1 end
    while true do
      local v
      v, i = flow(s, i)
      t[#t + 1] = v
      i = skip_ws(s, i)
      local d = s:sub(i, i)
      if d == "]" then return t, i + 1 end
      if d ~= "," then fail("expected ',' or ']' in flow sequence") end
      i = i + 1
    end
  elseif c == '"' then
    return double_quoted(s, i)
  elseif c == "'" then
    return single_quoted(s, i)
  else
    -- A plain word inside flow: up to , ] } or ": ".
    local j = i
    while j <= #s do
      local d = s:sub(j, j)
      if d == "," or d == "]" or d == "}" or d == "\n" then break end
      if d == ":" and s:sub(j + 1, j + 1):match("[%s,%]}]") then break end
      j = j + 1
    end
    return typed_plain((s:sub(i, j - 1):gsub("%s+$", ""))), j
  end
end

local function indent_of(line) return #line:match("^ *") end

-- Splits "key: rest" at the first ': ' (or trailing ':') outside quotes. Returns key, rest or nil.
local function split_key(text)
  local key, rest
  if text:sub(1, 1) == '"' then
    local k, j = double_quoted(text, 1)
    if text:sub(j, j) ~= ":" then return nil end
    return k, text:sub(j + 1)
  elseif text:sub(1, 1) == "'" then
    local k, j = single_quoted(text, 1)
    if text:sub(j, j) ~= ":" then return nil end
    return k, text:sub(j + 1)
  end
  key, rest = text:match("^([^#][^:]-):%s(.*)$")
  if key == nil then key = text:match("^([^#][^:]-):$"); rest = "" end
  if key == nil or key:match("^[%[{]") then return nil end
  return key, rest
end

local function strip_comment(text)
  -- Only for plain scalars: ' #' starts a comment.
  local p = text:find(" #", 1, true)
  if p then text = text:sub(1, p - 1) end
  return (text:gsub("%s+$", ""))
end

local function parse_yaml(src)
  local lines = {}
  for line in (src .. "\n"):gmatch("(.-)\r?\n") do lines[#lines + 1] = line end
  local pos = 1
  local function meaningful(i)
    while i <= #lines do
      local l = lines[i]
      if not (l:match("^%s*$") or l:match("^%s*#") or l == "---" or l == "...") then return i end
      i = i + 1
    end
    return nil
  end

  local block -- forward

  local function block_scalar(header, ind)
    local style, chomp = header:sub(1, 1), header:match("[-+]") or "clip"
    local out, body_ind = {}, nil
    while pos <= #lines do
      local l = lines[pos]
      if l:match("^%s*$") then
        out[#out + 1] = ""; pos = pos + 1
      else
        local li = indent_of(l)
        if li <= ind then break end
        body_ind = body_ind or li
        out[#out + 1] = l:sub(body_ind + 1); pos = pos + 1
      end
    end
    while chomp ~= "+" and #out > 0 and out[#out] == "" do out[#out] = nil end
    local text
    if style == "|" then
      text = table.concat(out, "\n")
    else
      text = table.concat(out, " ")
    end
    if chomp ~= "-" and #out > 0 then text = text .. "\n" end
    return text
  end

  -- A scalar or flow value that starts on the current line after a key or dash.
  local function inline_value(rest, ind, lineno)
    rest = rest:gsub("^%s+", "")
    local c = rest:sub(1, 1)
    if c == "|" or c == ">" then
      return block_scalar(rest, ind)
    elseif c == "[" or c == "{" or c == '"' or c == "'" then
      -- Quoted or flow values may continue on following lines.
      local text = rest
      while true do
        local ok, v, j = pcall(flow, text, 1)
        if ok then
          local tail = text:sub(j):gsub("^%s+", "")
          if tail ~= "" and tail:sub(1, 1) ~= "#" then fail("unexpected text after value: " .. tail, lineno) end
          return v
        end
        if pos > #lines then fail(v, lineno) end
        text = text .. "\n" .. lines[pos]:gsub("^%s+", ""); pos = pos + 1
      end
    else
      local text = strip_comment(rest)
      -- Plain scalars may continue on more-indented lines.
      while pos <= #lines and not lines[pos]:match("^%s*$") and indent_of(lines[pos]) > ind
        and not split_key(lines[pos]:gsub("^%s+", "")) and not lines[pos]:match("^%s*- ") do
        text = text .. " " .. strip_comment((lines[pos]:gsub("^%s+", ""))); pos = pos + 1
      end
      return typed_plain(text)
    end
  end

  local function sequence(ind)
    local t = {}
    while true do
      local i = meaningful(pos)
      if i == nil then break end
      local l = lines[i]
      if indent_of(l) ~= ind or not (l:sub(ind + 1, ind + 2) == "- " or l:sub(ind + 1) == "-") then break end
      pos = i
      local rest = l:sub(ind + 3)
      if rest:match("^%s*$") or rest:match("^%s*#") then
        pos = pos + 1
        local n = meaningful(pos)
        if n and indent_of(lines[n]) > ind then
          pos = n; t[#t + 1] = block(indent_of(lines[n]))
        else
          t[#t + 1] = nil
        end
      elseif split_key(rest) then
        -- "- key: v" starts a mapping at ind+2: rewrite the line and parse it as one.
        lines[pos] = string.rep(" ", ind + 2) .. rest
        t[#t + 1] = block(ind + 2)
      else
        pos = pos + 1
        t[#t + 1] = inline_value(rest, ind, i)
      end
    end
    return t
  end

  local function mapping(ind)
    local t = {}
    while true do
      local i = meaningful(pos)
      if i == nil then break end
      local l = lines[i]
      if indent_of(l) ~= ind or l:sub(ind + 1, ind + 2) == "- " then break end
      local key, rest = split_key(l:sub(ind + 1))
      if key == nil then fail("expected 'key: value': " .. l, i) end
      pos = i + 1
      if rest:match("^%s*$") or rest:match("^%s*#") then
        local n = meaningful(pos)
        if n and indent_of(lines[n]) > ind then
          pos = n; t[key] = block(indent_of(lines[n]))
        elseif n and indent_of(lines[n]) == ind and lines[n]:sub(ind + 1, ind + 2) == "- " then
          pos = n; t[key] = sequence(ind) -- kubectl style: "- " at the key's indentation
        else
          t[key] = nil
        end
      else
        t[key] = inline_value(rest, ind, i)
      end
    end
    return t
  end

  block = function(ind)
    local i = meaningful(pos)
    if i == nil then return nil end
    pos = i
    local l = lines[i]
    if l:sub(ind + 1, ind + 2) == "- " or l:sub(ind + 1) == "-" then return sequence(ind) end
    if split_key(l:sub(ind + 1)) then return mapping(ind) end
    pos = pos + 1
    return inline_value(l:sub(ind + 1), ind - 1, i)
  end

  local first = meaningful(1)
  if first == nil then return nil end
  local value = block(indent_of(lines[first]))
  local left = meaningful(pos)
  if left then fail("unexpected content: " .. lines[left], left) end
  return value
end

local function decode(src)
  local s = skip_ws(src, 1)
  if src:sub(s, s) == "{" or src:sub(s, s) == "[" then
    local v, j = flow(src, s)
    if skip_ws(src, j) <= #src then fail("trailing content after JSON document") end
    return v
  end
  return parse_yaml(src)
end

local function read_file(path)
  local f = assert(io.open(path, "r"))
  local s = f:read("a")
  f:close()
  return s
end

local function load_document(path)
  local ok, v = pcall(decode, read_file(path))
  if not ok then error(path .. ": " .. v, 0) end
  return v
end

---------------------------------------------------------------------------------------------

local function health(script, object)
  local env = setmetatable({ obj = object }, { __index = _G })
  local chunk = assert(loadfile(script, "t", env))
  return chunk()
end

local passed, failed = 0, 0
local pipe = assert(io.popen("find '" .. root .. "' -name health_test.yaml | sort"))
local found = false
for test_file in pipe:lines() do
  found = true
  local dir = test_file:match("^(.*)/[^/]+$")
  local script = dir .. "/health.lua"
  local spec = load_document(test_file)
  for n, case in ipairs(spec.tests or {}) do
    local want = case.healthStatus or {}
    local label = string.format("%s [%d] %s", dir:sub(#root + 2), n, case.inputPath)
    local ok, got = pcall(function() return health(script, load_document(dir .. "/" .. case.inputPath)) end)
    if not ok then
      failed = failed + 1
      print("FAIL " .. label .. ": " .. tostring(got))
    elseif got.status ~= want.status or (want.message ~= nil and got.message ~= want.message) then
      failed = failed + 1
      print(string.format("FAIL %s\n  want %s: %s\n  got  %s: %s", label, tostring(want.status),
        tostring(want.message), tostring(got.status), tostring(got.message)))
    else
      passed = passed + 1
      print(string.format("ok   %s -> %s: %s", label, got.status, got.message))
    end
  end
end
pipe:close()
if not found then
  print("no health_test.yaml under " .. root)
  os.exit(1)
end
print(string.format("%d passed, %d failed", passed, failed))
os.exit(failed == 0 and 0 or 1)

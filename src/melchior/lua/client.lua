--[[
melchior — a plain-Lua client for melchior sessions.

Printed by `melchior lua-api`. Siblings copy this file rather than port it. It has
no dependencies of its own and runs on Lua 5.1, 5.2, 5.3, 5.4, 5.5 and LuaJIT.

USE

  local melchior = load(src)(host.stream)          -- or load(src)(host.stream, settings)
  local them = melchior.connect("beta-nu")
  print(them.status())                             -- a status object; tostring() is JSON
  them.tell("the parser is done", "attention")
  them:close()

  (Lua 5.1 has no load() of strings: use loadstring(src)(host.stream).)

THE HOST CONTRACT: host.stream

The client never opens a socket itself; the host hands it one function:

  host.stream(path) -> stream
      Open a unix-domain STREAM socket connected to `path` (a filesystem path,
      given as a Lua string). On failure either raise a Lua error or return
      nil, message. The message should say why (e.g. "connection refused").

  stream:read(n) -> string | nil [, message]
      Block until at least one byte is available and return between 1 and n
      bytes (fewer than n is fine: the client loops). At end of stream return
      nil or "" (with no message). On failure raise, or return nil, message.

  stream:write(s) -> true | integer | nil, message
      Send the bytes of s. Return anything but nil when all of s was sent; an
      integer k < #s means only the first k bytes were sent and the client sends
      the rest. On failure raise, or return nil, message.

  stream:close()
      Close the socket. Called at most once per stream. Errors are ignored.

Methods are called with a colon (stream:read(n)), like Lua files and LuaSocket
objects. Timeouts, if wanted, are the host's to apply inside read/write: an
error raised there becomes the error of the call in progress.

SETTINGS (the optional second argument, or melchior.configure{...})

  from     this session's id, sent as "from" with every call;
           default os.getenv("MAGI_MELCHIOR_ID")
  at       the "at" of this session's {"event":"listening","at":…}: sets
           dir (its directory) and from (its last part) in one go
  dir      the project's registry directory; default
           $XDG_RUNTIME_DIR/melchior/$MAGI_MELCHIOR_PROJECT where that is
           melchior's rule too, else an error asking for `at`
  list     function(dir) -> array of file names in dir (default: io.popen "ls")
  read     function(path) -> file contents or nil (default: io.open)
  getenv   function(name) -> string or nil (default: os.getenv)
  limit    largest frame accepted or sent, in bytes (default 16 MiB)
  on_event function(event) for an {"event":…} that arrives before a reply
  stream   an opener to use instead of the one given to the chunk

THE WIRE

Each message is four bytes of big-endian length, then that many bytes of UTF-8
JSON. A call is {"call":verb,"args":[…],"from":id,"id":n}; a reply is
{"ok":true,"family":1,"n":N,"result":[…]} or
{"ok":false,"family":1,"n":0,"result":[],"error":{"code":…,"reason":…}}.
Results are unwrapped: them.status() returns the single status object, and a
verb with several results returns them all. A refusal becomes a Lua error
carrying the reason. A reply in a family newer than this client knows (1) is
refused; an older one is read. An {"event":…} arriving before a reply is handed
to settings.on_event, if set, and otherwise skipped.

JSON VALUES IN LUA

  null -> melchior.null;  objects and arrays -> tables marked by metatable, so
  they encode back as they came (tostring() of either is its JSON).
  Integers stay integers on Lua 5.3+ wherever 64 bits hold them; beyond that,
  and on Lua 5.1/5.2/LuaJIT (one number type), numbers are doubles.
  An unmarked Lua table encodes as an array when its keys are exactly 1..n,
  as an object when its keys are all strings; an empty unmarked table is {}.
  Use melchior.array{} / melchior.object{} to say which.
]]

local stream_opener, initial = ...

local FAMILY = 1
local DEFAULT_LIMIT = 16 * 1024 * 1024
local MAX_DEPTH = 512

local byte, char, find, format, sub, gsub = string.byte, string.char, string.find,
  string.format, string.sub, string.gsub
local concat, sort = table.concat, table.sort
local floor = math.floor
local unpack = table.unpack or unpack
local math_type = math.type -- nil before Lua 5.3: then there is one number type

local M = { family = FAMILY }

local function fail(fmt, ...)
  error("melchior: " .. format(fmt, ...), 0)
end

-- JSON -------------------------------------------------------------------------------------

local null = setmetatable({}, {
  __tostring = function()
    return "null"
  end,
})
M.null = null

local object_mt, array_mt = {}, {}

function M.object(t)
  return setmetatable(t or {}, object_mt)
end

function M.array(t)
  return setmetatable(t or {}, array_mt)
end

-- Position of the first byte that is not well-formed UTF-8, or nil when all is well.
-- Overlong forms, surrogates and code points past U+10FFFF are refused.
local function utf8_error(s)
  local i = 1
  while true do
    i = find(s, "[\128-\255]", i)
    if not i then
      return nil
    end
    local c = byte(s, i)
    local need, cp, least
    if c >= 0xC2 and c <= 0xDF then
      need, cp, least = 1, c - 0xC0, 0x80
    elseif c >= 0xE0 and c <= 0xEF then
      need, cp, least = 2, c - 0xE0, 0x800
    elseif c >= 0xF0 and c <= 0xF4 then
      need, cp, least = 3, c - 0xF0, 0x10000
    else
      return i
    end
    for k = 1, need do
      local b = byte(s, i + k)
      if not b or b < 0x80 or b > 0xBF then
        return i
      end
      cp = cp * 64 + (b - 0x80)
    end
    if cp < least or cp > 0x10FFFF or (cp >= 0xD800 and cp <= 0xDFFF) then
      return i
    end
    i = i + need + 1
  end
end

local escapes = {
  ['"'] = '\\"',
  ["\\"] = "\\\\",
  ["\b"] = "\\b",
  ["\f"] = "\\f",
  ["\n"] = "\\n",
  ["\r"] = "\\r",
  ["\t"] = "\\t",
}

local function escape_char(c)
  return escapes[c] or format("\\u%04x", byte(c))
end

local function encode_string(s, out)
  local bad = utf8_error(s)
  if bad then
    fail("cannot encode a string that is not UTF-8 (bad byte at %d)", bad)
  end
  out[#out + 1] = '"' .. gsub(s, '[%c"\\]', escape_char) .. '"'
end

local function shortest(x)
  local s
  for _, fmt in ipairs({ "%.14g", "%.15g", "%.16g", "%.17g" }) do
    s = format(fmt, x)
    if tonumber(s) == x then
      break
    end
  end
  return (gsub(s, ",", "."))
end

local function encode_number(x, out)
  if x ~= x or x == math.huge or x == -math.huge then
    fail("cannot encode %s: JSON has no NaN or infinity", tostring(x))
  end
  local s
  if math_type then
    if math_type(x) == "integer" then
      s = format("%d", x)
    else
      s = shortest(x)
      if not find(s, "[%.eEn]") then
        s = s .. ".0" -- a float stays a float on the far side
      end
    end
  elseif x == floor(x) and x > -2 ^ 53 and x < 2 ^ 53 then
    s = format("%.0f", x)
  else
    s = shortest(x)
  end
  out[#out + 1] = s
end

local encode_value

local function encode_array(t, n, out, depth)
  out[#out + 1] = "["
  for i = 1, n do
    if i > 1 then
      out[#out + 1] = ","
    end
    encode_value(t[i], out, depth)
  end
  out[#out + 1] = "]"
end

local function encode_object(t, keys, out, depth)
  sort(keys)
  out[#out + 1] = "{"
  for i, k in ipairs(keys) do
    if i > 1 then
      out[#out + 1] = ","
    end
    encode_string(k, out)
    out[#out + 1] = ":"
    encode_value(t[k], out, depth)
  end
  out[#out + 1] = "}"
end

local function encode_table(t, out, depth)
  if depth > MAX_DEPTH then
    fail("cannot encode: nested deeper than %d (a table that contains itself?)", MAX_DEPTH)
  end
  local mt = getmetatable(t)
  local keys, count, strings = {}, 0, true
  for k in pairs(t) do
    count = count + 1
    if type(k) == "string" then
      keys[#keys + 1] = k
    else
      strings = false
    end
  end
  if mt == array_mt or (mt ~= object_mt and not strings) then
    local n = #t
    if count ~= n then
      for k in pairs(t) do
        if type(k) ~= "number" or k < 1 or k > n or k ~= floor(k) then
          fail("cannot encode a table with key %s as a JSON array", tostring(k))
        end
      end
    end
    return encode_array(t, n, out, depth + 1)
  end
  if not strings then
    for k in pairs(t) do
      if type(k) ~= "string" then
        fail("cannot encode a table with key %s as a JSON object", tostring(k))
      end
    end
  end
  return encode_object(t, keys, out, depth + 1)
end

function encode_value(v, out, depth)
  local t = type(v)
  if v == nil or v == null then
    out[#out + 1] = "null"
  elseif t == "boolean" then
    out[#out + 1] = v and "true" or "false"
  elseif t == "number" then
    encode_number(v, out)
  elseif t == "string" then
    encode_string(v, out)
  elseif t == "table" then
    encode_table(v, out, depth)
  else
    fail("cannot encode a %s as JSON", t)
  end
end

--- Encode a Lua value as compact JSON text.
function M.encode(v)
  local out = {}
  encode_value(v, out, 0)
  return concat(out)
end

local function tojson(t)
  return M.encode(t)
end
object_mt.__tostring, array_mt.__tostring = tojson, tojson

local function utf8_char(cp)
  if cp < 0x80 then
    return char(cp)
  elseif cp < 0x800 then
    return char(0xC0 + floor(cp / 64), 0x80 + cp % 64)
  elseif cp < 0x10000 then
    return char(0xE0 + floor(cp / 4096), 0x80 + floor(cp / 64) % 64, 0x80 + cp % 64)
  end
  return char(
    0xF0 + floor(cp / 262144),
    0x80 + floor(cp / 4096) % 64,
    0x80 + floor(cp / 64) % 64,
    0x80 + cp % 64
  )
end

local simple = { ['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n", r = "\r", t = "\t" }

local function bad_json(pos, what)
  fail("bad JSON at byte %d: %s", pos, what)
end

local function skip(s, pos)
  return find(s, "[^ \t\r\n]", pos) or #s + 1
end

local function hex4(s, pos)
  local h = sub(s, pos, pos + 3)
  if not find(h, "^%x%x%x%x$") then
    bad_json(pos, "\\u needs four hex digits")
  end
  return tonumber(h, 16)
end

local function parse_string(s, pos)
  local parts, i = {}, pos + 1
  while true do
    local j = find(s, '[%c"\\]', i)
    if not j then
      bad_json(pos, "unterminated string")
    end
    local c = byte(s, j)
    if c == 34 then
      parts[#parts + 1] = sub(s, i, j - 1)
      return concat(parts), j + 1
    elseif c == 92 then
      parts[#parts + 1] = sub(s, i, j - 1)
      local e = sub(s, j + 1, j + 1)
      if e == "u" then
        local cp = hex4(s, j + 2)
        i = j + 6
        if cp >= 0xD800 and cp <= 0xDBFF then
          if sub(s, i, i + 1) ~= "\\u" then
            bad_json(j, "lone surrogate in \\u escape")
          end
          local lo = hex4(s, i + 2)
          if lo < 0xDC00 or lo > 0xDFFF then
            bad_json(j, "lone surrogate in \\u escape")
          end
          cp = 0x10000 + (cp - 0xD800) * 1024 + (lo - 0xDC00)
          i = i + 6
        elseif cp >= 0xDC00 and cp <= 0xDFFF then
          bad_json(j, "lone surrogate in \\u escape")
        end
        parts[#parts + 1] = utf8_char(cp)
      elseif simple[e] then
        parts[#parts + 1] = simple[e]
        i = j + 2
      else
        bad_json(j, "unknown escape \\" .. e)
      end
    elseif c == 127 then
      parts[#parts + 1] = sub(s, i, j)
      i = j + 1
    else
      bad_json(j, "raw control character in string")
    end
  end
end

local function parse_number(s, pos)
  local _, e = find(s, "^-?%d+", pos)
  if not e then
    bad_json(pos, "unexpected character")
  end
  if find(s, "^-?0%d", pos) then
    bad_json(pos, "leading zero in number")
  end
  if sub(s, e + 1, e + 1) == "." then
    _, e = find(s, "^%d+", e + 2)
    if not e then
      bad_json(pos, "digits must follow a decimal point")
    end
  end
  if find(s, "^[eE]", e + 1) then
    _, e = find(s, "^[-+]?%d+", e + 2)
    if not e then
      bad_json(pos, "digits must follow an exponent")
    end
  end
  return tonumber(sub(s, pos, e)), e + 1
end

local parse_value

local function parse_array(s, pos, depth)
  local t, n = setmetatable({}, array_mt), 0
  pos = skip(s, pos + 1)
  if sub(s, pos, pos) == "]" then
    return t, pos + 1
  end
  while true do
    local v
    v, pos = parse_value(s, pos, depth)
    n = n + 1
    t[n] = v
    pos = skip(s, pos)
    local c = sub(s, pos, pos)
    if c == "]" then
      return t, pos + 1
    elseif c ~= "," then
      bad_json(pos, "expected ',' or ']' in array")
    end
    pos = skip(s, pos + 1)
  end
end

local function parse_object(s, pos, depth)
  local t = setmetatable({}, object_mt)
  pos = skip(s, pos + 1)
  if sub(s, pos, pos) == "}" then
    return t, pos + 1
  end
  while true do
    if sub(s, pos, pos) ~= '"' then
      bad_json(pos, "expected a string key in object")
    end
    local k
    k, pos = parse_string(s, pos)
    pos = skip(s, pos)
    if sub(s, pos, pos) ~= ":" then
      bad_json(pos, "expected ':' after key")
    end
    local v
    v, pos = parse_value(s, skip(s, pos + 1), depth)
    t[k] = v
    pos = skip(s, pos)
    local c = sub(s, pos, pos)
    if c == "}" then
      return t, pos + 1
    elseif c ~= "," then
      bad_json(pos, "expected ',' or '}' in object")
    end
    pos = skip(s, pos + 1)
  end
end

local literals = { t = { "true", true }, f = { "false", false }, n = { "null", null } }

function parse_value(s, pos, depth)
  local c = sub(s, pos, pos)
  if c == "{" or c == "[" then
    if depth >= MAX_DEPTH then
      bad_json(pos, "nested deeper than " .. MAX_DEPTH)
    end
    if c == "{" then
      return parse_object(s, pos, depth + 1)
    end
    return parse_array(s, pos, depth + 1)
  elseif c == '"' then
    return parse_string(s, pos)
  elseif literals[c] then
    local word, value = literals[c][1], literals[c][2]
    if sub(s, pos, pos + #word - 1) ~= word then
      bad_json(pos, "unexpected character")
    end
    return value, pos + #word
  elseif c == "" then
    bad_json(pos, "unexpected end of text")
  end
  return parse_number(s, pos)
end

--- Decode JSON text into Lua values (see "JSON VALUES IN LUA" above).
function M.decode(s)
  if type(s) ~= "string" then
    fail("decode needs a string, got %s", type(s))
  end
  local bad = utf8_error(s)
  if bad then
    fail("JSON text is not UTF-8 (bad byte at %d)", bad)
  end
  local v, pos = parse_value(s, skip(s, 1), 0)
  pos = skip(s, pos)
  if pos <= #s then
    bad_json(pos, "trailing characters after the value")
  end
  return v
end

-- Settings and discovery -------------------------------------------------------------------

local settings = {}

local function setting(name)
  return settings[name]
end

local function getenv(name)
  local f = settings.getenv or (os and os.getenv)
  return f and f(name) or nil
end

function M.configure(opts)
  for k, v in pairs(opts or {}) do
    settings[k] = v
  end
  if opts and opts.at then
    local dir, id = string.match(opts.at, "^(.*)/([^/]+)$")
    if not dir then
      fail("settings.at %q is not a socket path", tostring(opts.at))
    end
    if opts.dir == nil then
      settings.dir = dir
    end
    if opts.from == nil then
      settings.from = id
    end
  end
  return M
end

-- The same budget as melchior.names: a socket address holds 107 usable bytes, and the
-- longest name ever bound in a registry is '.<26-character id>.tmp'.
local SUN_PATH_MAX, LONGEST_NAME = 107, #"/..tmp" + 26
local ASK_AT = "pass configure{at=<listening.at>} (or configure{dir=...})"

--- The project's registry directory: settings.dir, else from the environment.
--- The environment rule is melchior's simple case only. Where melchior would go
--- elsewhere (no usable XDG_RUNTIME_DIR: /tmp/melchior-<uid>; a path too long for a
--- socket: a hashed project key) this refuses with the reason instead of guessing a
--- directory nobody listens in; a harness knows the directory from listening.at.
function M.dir()
  if setting("dir") then
    return setting("dir")
  end
  local runtime, project = getenv("XDG_RUNTIME_DIR"), getenv("MAGI_MELCHIOR_PROJECT")
  if not project or project == "" then
    fail(
      "cannot tell which registry to use: MAGI_MELCHIOR_PROJECT is not set (melchior "
        .. "derives the project from the working tree); %s",
      ASK_AT
    )
  end
  if
    #project > 64
    or not find(project, "^[%w][%w._-]*$")
    or find(project, "..", 1, true)
  then
    fail("MAGI_MELCHIOR_PROJECT %q is not a project name melchior accepts", project)
  end
  if not runtime or sub(runtime, 1, 1) ~= "/" then
    fail(
      "cannot tell which registry to use: XDG_RUNTIME_DIR is not an absolute path, so "
        .. "melchior uses /tmp/melchior-<uid>; %s",
      ASK_AT
    )
  end
  local dir = gsub(runtime, "/+$", "") .. "/melchior/" .. project
  if #dir + LONGEST_NAME > SUN_PATH_MAX then
    fail(
      "cannot tell which registry to use: %s is too long for a socket address, so "
        .. "melchior keys project %q by a hash; %s",
      dir,
      project,
      ASK_AT
    )
  end
  return dir
end

local function is_id(name)
  return type(name) == "string" and find(name, "^[%w][%w_-]*$") ~= nil
end

local function shell_quote(s)
  return "'" .. gsub(s, "'", "'\\''") .. "'"
end

local function default_list(dir)
  if not (io and io.popen) then
    fail("listing %s needs io.popen, or configure{list=function(dir) ... end}", dir)
  end
  local ok, p = pcall(io.popen, "ls -1A " .. shell_quote(dir) .. " 2>/dev/null")
  if not ok or not p then
    fail(
      "listing %s needs io.popen (%s), or configure{list=function(dir) ... end}",
      dir,
      tostring(p or "unavailable")
    )
  end
  local names = {}
  for line in p:lines() do
    names[#names + 1] = line
  end
  p:close()
  return names
end

local function read_file(path)
  if settings.read then
    return settings.read(path)
  end
  if not (io and io.open) then
    fail("reading %s needs io.open, or configure{read=function(path) ... end}", path)
  end
  local f = io.open(path, "rb")
  if not f then
    return nil
  end
  local text = f:read("*a")
  f:close()
  return text
end

--- The ids in the registry, sorted. A name is not a promise: connect finds out.
function M.list()
  local ids = {}
  for _, name in ipairs((settings.list or default_list)(M.dir())) do
    if is_id(name) then -- '<id>.parent' notes and '.<id>.tmp' names are not sessions
      ids[#ids + 1] = name
    end
  end
  sort(ids)
  return M.array(ids)
end

--- Who started `id`, from its '<id>.parent' note; nil for a session nobody started.
function M.parent(id)
  if not is_id(id) then
    fail("%s is not a session id", tostring(id))
  end
  local text = read_file(M.dir() .. "/" .. id .. ".parent")
  if not text then
    return nil
  end
  text = gsub(text, "%s+$", "")
  return text ~= "" and text or nil
end

-- Framing ----------------------------------------------------------------------------------

local function header(n)
  return char(floor(n / 16777216) % 256, floor(n / 65536) % 256, floor(n / 256) % 256, n % 256)
end

local function length_of(h)
  local a, b, c, d = byte(h, 1, 4)
  return ((a * 256 + b) * 256 + c) * 256 + d
end

-- Connections ------------------------------------------------------------------------------

local function describe(err)
  return err == nil and "no reason given" or tostring(err)
end

local function open_stream(path, who)
  local opener = setting("stream") or stream_opener
  if opener == nil then
    fail("no host.stream: load the client as load(src)(host.stream)")
  end
  local ok, s, err = pcall(opener, path)
  if not ok then
    fail("cannot reach %s at %s: %s", who, path, describe(s))
  elseif s == nil then
    fail("cannot reach %s at %s: %s", who, path, describe(err))
  end
  return s
end

local function pack_args(n, ...)
  local args = { ... }
  while n > 0 and args[n] == nil do
    n = n - 1
  end
  for i = 1, n do
    if args[i] == nil then
      args[i] = null
    end
  end
  return M.array(args), n
end

function M.connect(id, opts)
  opts = opts or {}
  local path, who
  if type(id) ~= "string" or id == "" then
    fail("connect needs a session id, got %s", tostring(id))
  elseif find(id, "/") then
    path, who = id, string.match(id, "([^/]+)$") or id
  elseif is_id(id) then
    path, who = M.dir() .. "/" .. id, id
  else
    fail("%q is not a session id", id)
  end
  local limit = opts.limit or setting("limit") or DEFAULT_LIMIT
  local on_event = opts.on_event or setting("on_event")
  local stream = open_stream(path, who)
  local closed, seq = false, 0
  local them = { id = who, path = path }

  local function drop()
    if stream then
      pcall(stream.close, stream)
      stream = nil
    end
  end

  local function broken(fmt, ...)
    drop()
    fail("%s: " .. fmt, who, ...)
  end

  local function send(data)
    local rest = data
    while #rest > 0 do
      local ok, sent, err = pcall(stream.write, stream, rest)
      if not ok then
        broken("write failed: %s", describe(sent))
      elseif sent == nil then
        broken("write failed: %s", describe(err))
      elseif type(sent) == "number" and sent < #rest then
        if sent < 1 then
          broken("host stream write made no progress (returned %s)", tostring(sent))
        end
        rest = sub(rest, sent + 1)
      else
        rest = ""
      end
    end
  end

  local function recv_exact(n, started)
    local parts, got = {}, 0
    while got < n do
      local ok, chunk, err = pcall(stream.read, stream, n - got)
      if not ok then
        broken("read failed: %s", describe(chunk))
      elseif chunk == nil or chunk == "" then
        if err ~= nil then
          broken("read failed: %s", describe(err))
        elseif got == 0 and not started then
          broken("closed the connection before replying")
        end
        broken("closed the connection inside a frame (%d of %d bytes)", got, n)
      elseif type(chunk) ~= "string" then
        broken("host stream read(%d) returned a %s, not a string", n - got, type(chunk))
      elseif #chunk > n - got then
        broken("host stream read(%d) returned %d bytes, more than asked", n - got, #chunk)
      end
      parts[#parts + 1] = chunk
      got = got + #chunk
    end
    return concat(parts)
  end

  local function recv()
    local n = length_of(recv_exact(4, false))
    if n == 0 or n > limit then
      broken("sent a frame of %d bytes (limit %d); the framing is lost", n, limit)
    end
    local body = recv_exact(n, true)
    local ok, msg = pcall(M.decode, body)
    if not ok then
      fail("%s: unreadable reply: %s", who, msg)
    end
    if getmetatable(msg) ~= object_mt then
      fail("%s: a message must be a JSON object", who)
    end
    return msg
  end

  local function check_reply(reply, verb, sent_id)
    if reply.call ~= nil then
      fail("%s sent a call where a reply to %s was expected", who, verb)
    end
    if type(reply.ok) ~= "boolean" then
      fail("%s: reply to %s has no 'ok' true or false", who, verb)
    end
    local family = reply.family
    if family == nil then
      family = FAMILY
    end
    if type(family) ~= "number" or family ~= floor(family) or family < 1 then
      fail("%s: reply 'family' must be a positive integer, got %s", who, tostring(family))
    end
    if family > FAMILY then
      fail(
        "%s replied in family %d, newer than this client knows (%d); "
          .. "get a newer client from 'melchior lua-api'",
        who,
        family,
        FAMILY
      )
    end
    local result = reply.result
    if getmetatable(result) ~= array_mt then
      fail("%s: reply 'result' must be a list", who)
    end
    if reply.n ~= #result then
      fail("%s: reply 'n' is %s but 'result' holds %d", who, tostring(reply.n), #result)
    end
    if reply.id ~= nil and reply.id ~= sent_id then
      fail("%s answered call %s while %s was awaited", who, tostring(reply.id), sent_id)
    end
  end

  --- Send one call and return the whole reply, refused or not (transport errors raise).
  local function exchange(verb, ...)
    if closed then
      fail("the connection to %s is closed", who)
    end
    if type(verb) ~= "string" or verb == "" then
      fail("a verb must be a non-empty string, got %s", tostring(verb))
    end
    if not stream then
      stream = open_stream(path, who)
    end
    seq = seq + 1
    local sent_id = "lua-" .. seq
    local args = pack_args(select("#", ...), ...)
    local msg = M.object({ call = verb, args = args, id = sent_id })
    local from = opts.from or setting("from") or getenv("MAGI_MELCHIOR_ID")
    if from ~= nil then
      msg.from = from
    end
    local body = M.encode(msg)
    if #body > limit then
      fail("the call to %s is %d bytes, over the %d-byte frame limit", verb, #body, limit)
    end
    send(header(#body) .. body)
    -- Anything but a well-formed reply leaves the stream at an unknown point (a reply
    -- may still be on its way), so the connection is dropped and the next call
    -- starts on a fresh one rather than reading an answer meant for this one.
    local ok, reply = pcall(function()
      while true do
        local msg = recv()
        if msg.event == nil then
          check_reply(msg, verb, sent_id)
          return msg
        elseif on_event then
          on_event(msg)
        end
      end
    end)
    if not ok then
      drop()
      error(reply, 0)
    end
    return reply
  end

  local function call(verb, ...)
    local reply = exchange(verb, ...)
    if not reply.ok then
      local e = reply.error
      local reason = type(e) == "table" and e.reason or nil
      local code = type(e) == "table" and e.code or nil
      fail(
        "%s refused %s: %s%s",
        who,
        verb,
        type(reason) == "string" and reason or "no reason given",
        type(code) == "string" and " [" .. code .. "]" or ""
      )
    end
    return unpack(reply.result, 1, reply.n)
  end

  local function need_string(verb, what, v)
    if type(v) ~= "string" then
      fail("%s needs %s as a string, got %s", verb, what, type(v))
    end
  end

  -- Every function works called with '.' or ':' (them.tell(...) and them:tell(...)).
  local function method(f)
    return function(first, ...)
      if first == them then
        return f(...)
      end
      return f(first, ...)
    end
  end

  them.call = method(call)
  them.reply = method(exchange)
  them.status = method(function()
    return call("status")
  end)
  them.verbs = method(function()
    return call("verbs")
  end)
  them.tell = method(function(text, sort_)
    need_string("tell", "the text", text)
    if sort_ ~= nil then
      need_string("tell", "the sort", sort_)
    end
    return call("tell", text, sort_)
  end)
  them.ask = method(function(text)
    need_string("ask", "the text", text)
    return call("ask", text)
  end)
  them.answer = method(function(about, text)
    need_string("answer", "about (<id>@<message-id>)", about)
    need_string("answer", "the text", text)
    return call("answer", about, text)
  end)
  them.task = method(function(about)
    need_string("task", "about (<id>@<message-id>)", about)
    return call("task", about)
  end)
  them.close = method(function()
    closed = true
    drop()
  end)
  return them
end

--- True when `id` answers a status call now; false and the error otherwise.
function M.reachable(id, opts)
  local ok, err = pcall(function()
    local them = M.connect(id, opts)
    local fine, e = pcall(them.status)
    them.close()
    if not fine then
      error(e, 0)
    end
  end)
  if ok then
    return true
  end
  return false, err
end

M.configure(initial)
return M

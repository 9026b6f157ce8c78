/**
 * The audit's index of what a read may filter on (type, node, ref, and node with type): one
 * sorted set whose members all score 0 and so sort by their bytes, `<field>:<value>\0\0<id>`
 * (`m:<node>\0\0<type>\0\0<id>` for node with type), with the stream id written at a fixed
 * width so that the members of one value sort as their entries do. A filtered read takes the ids
 * of its value's entries from the index and fetches only those entries. The index is written in
 * the same Lua script as the entry it points at and loses the entry's members with the entry when
 * the stream is trimmed, so it never points at more than the stream holds.
 *
 * Entries written before the index existed are indexed once, newest first, a chunk per script
 * call (INDEX_EARLIER), by the first filtered read that finds the work undone: the key
 * `audit-indexed-from` holds the oldest id from which on every entry is indexed, `0-0` once all
 * are.
 */

export interface IndexFilter {
  readonly type?: string | undefined;
  readonly node?: string | undefined;
  readonly ref?: string | undefined;
}

/** The longest value a query may name, in characters (auditQuerySchema). */
export const QUERY_VALUE_MAX_CHARS = { node: 64, ref: 128 } as const;

/**
 * Values longer than this many bytes, NULs counted twice as they are written, are not indexed: no
 * query can name them (a character of a JavaScript string takes at most 3 bytes in UTF-8). This
 * bounds what the index takes per entry (AUDIT_INDEX_BYTES).
 */
export const INDEX_VALUE_MAX_BYTES = { type: 32, node: 3 * QUERY_VALUE_MAX_CHARS.node, ref: 3 * QUERY_VALUE_MAX_CHARS.ref } as const;

/** Entries indexed, or index members looked up, per script call. */
export const INDEX_CHUNK = 1000;

/** Entries the stream sheds (with their index members) per append when it is over its length. */
export const TRIM_CHUNK = 1000;

const ID_DIGITS = 20;

/** A stream id as the index writes it: both parts zero-padded to 20 digits (2^64 has 20). */
export function sortableId(id: string): string {
  const [ms = '0', seq = '0'] = id.split('-');
  return `${ms.padStart(ID_DIGITS, '0')}-${seq.padStart(ID_DIGITS, '0')}`;
}

// A NUL in a value is written as NUL 0x01, so the first double NUL ends the value and no
// value's members fall among another's.
function escaped(field: keyof typeof INDEX_VALUE_MAX_BYTES, value: string): string | undefined {
  const written = value.replaceAll('\0', '\0\x01');
  return Buffer.byteLength(written) <= INDEX_VALUE_MAX_BYTES[field] ? written : undefined;
}

/**
 * The prefixes of the index members that name the entries a filter may match, one per index
 * the filter can read (ref; node with type, or node, or type): each entry matching the filter
 * is under every one of them. None for no filter; undefined when a value is too long to be
 * indexed, and so is in no entry a query can name.
 */
export function indexPrefixes(filter: IndexFilter): string[] | undefined {
  const prefixes: string[] = [];
  const values = {
    type: filter.type ? escaped('type', filter.type) : '',
    node: filter.node ? escaped('node', filter.node) : '',
    ref: filter.ref ? escaped('ref', filter.ref) : '',
  };
  if (values.type === undefined || values.node === undefined || values.ref === undefined) return undefined;
  if (values.ref) prefixes.push(`r:${values.ref}\0\0`);
  if (values.node && values.type) prefixes.push(`m:${values.node}\0\0${values.type}\0\0`);
  else if (values.node) prefixes.push(`n:${values.node}\0\0`);
  else if (values.type) prefixes.push(`t:${values.type}\0\0`);
  return prefixes;
}

/** Above every member that starts with the prefix: the id that follows is digits and `-`. */
export const PREFIX_END = '\x7f';

// The same rules as sortableId, escaped and indexPrefixes, for the scripts. Lua 5.1 has no `\0`
// in patterns: `%z` is NUL.
const LUA_MEMBERS = `
local ID_DIGITS = ${ID_DIGITS}
local VALUE_MAX_BYTES = { type = ${INDEX_VALUE_MAX_BYTES.type}, node = ${INDEX_VALUE_MAX_BYTES.node}, ref = ${INDEX_VALUE_MAX_BYTES.ref} }

local function sortable_id(id)
  local ms, seq = string.match(id, '^(%d+)%-(%d+)$')
  return string.rep('0', ID_DIGITS - #ms) .. ms .. '-' .. string.rep('0', ID_DIGITS - #seq) .. seq
end

-- The index members of a stream entry, from its id and its field list.
local function index_members(id, fields)
  local values = {}
  for i = 1, #fields - 1, 2 do
    local limit = VALUE_MAX_BYTES[fields[i]]
    if limit and fields[i + 1] ~= '' then
      local written = string.gsub(fields[i + 1], '%z', function() return '\\0\\1' end)
      if #written <= limit then values[fields[i]] = written end
    end
  end
  local suffix = sortable_id(id)
  local members = {}
  if values.type then members[#members + 1] = 't:' .. values.type .. '\\0\\0' .. suffix end
  if values.node then members[#members + 1] = 'n:' .. values.node .. '\\0\\0' .. suffix end
  if values.ref then members[#members + 1] = 'r:' .. values.ref .. '\\0\\0' .. suffix end
  if values.node and values.type then members[#members + 1] = 'm:' .. values.node .. '\\0\\0' .. values.type .. '\\0\\0' .. suffix end
  return members
end

-- The oldest id from which on every entry is indexed. Set on first use: everything after the
-- newest entry there is, or 0-0 for an empty stream.
local function indexed_from(audit, marker)
  local from = redis.call('GET', marker)
  if from then return from end
  local newest = redis.call('XREVRANGE', audit, '+', '-', 'COUNT', 1)
  if newest[1] then
    local ms, seq = string.match(newest[1][1], '^(%d+)%-(%d+)$')
    from = ms .. '-' .. string.format('%.0f', tonumber(seq) + 1)
  else
    from = '0-0'
  end
  redis.call('SET', marker, from)
  return from
end
`;

/**
 * Appends an entry unless its marker is new (KEYS: written markers, stream, index, indexed-from;
 * ARGV: marker, max length, type, ref, node, summary, data, time, now ms, actor). Markers are a
 * sorted set by time, kept as long as the stream: the newest `max length` of them. The stream is
 * trimmed exactly, oldest first and at most TRIM_CHUNK entries per append, each trimmed entry's
 * index members with it.
 */
export const APPEND_INDEXED = `${LUA_MEMBERS}
if redis.call('ZADD', KEYS[1], 'NX', ARGV[9], ARGV[1]) == 0 then
  return false
end
local max_length = tonumber(ARGV[2])
local excess = redis.call('ZCARD', KEYS[1]) - max_length
if excess > 0 then
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, excess - 1)
end
indexed_from(KEYS[2], KEYS[4])
local length = redis.call('XLEN', KEYS[2])
local over = length + 1 - max_length
if over > 0 then
  local oldest = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', math.min(over, ${TRIM_CHUNK}))
  for _, row in ipairs(oldest) do
    for _, member in ipairs(index_members(row[1], row[2])) do redis.call('ZREM', KEYS[3], member) end
  end
  redis.call('XTRIM', KEYS[2], 'MAXLEN', length - #oldest)
end
local fields = { 'type', ARGV[3], 'ref', ARGV[4], 'node', ARGV[5], 'summary', ARGV[6], 'data', ARGV[7], 'time', ARGV[8], 'actor', ARGV[10] }
local id = redis.call('XADD', KEYS[2], '*', unpack(fields))
for _, member in ipairs(index_members(id, fields)) do redis.call('ZADD', KEYS[3], 0, member) end
return id
`;

/**
 * Indexes the next INDEX_CHUNK entries, newest first, of those written before the index (KEYS:
 * stream, index, indexed-from). Returns 1 once every entry is indexed, 0 while some are left.
 */
export const INDEX_EARLIER = `${LUA_MEMBERS}
local from = indexed_from(KEYS[1], KEYS[3])
if from == '0-0' then return 1 end
local rows = redis.call('XREVRANGE', KEYS[1], '(' .. from, '-', 'COUNT', ${INDEX_CHUNK})
for _, row in ipairs(rows) do
  for _, member in ipairs(index_members(row[1], row[2])) do redis.call('ZADD', KEYS[2], 0, member) end
end
if #rows < ${INDEX_CHUNK} then
  redis.call('SET', KEYS[3], '0-0')
  return 1
end
redis.call('SET', KEYS[3], rows[#rows][1])
return 0
`;

/**
 * Up to ARGV[4] index members between ARGV[1] and ARGV[2] (ZRANGE BYLEX bounds), newest first
 * when ARGV[3] is REV, and the entries they point at (KEYS: index, stream). Returns the number of
 * members, the last one's sortable id ('' if none) and the entries, as XRANGE gives them.
 */
export const READ_INDEXED = `
local members
if ARGV[3] == 'REV' then
  members = redis.call('ZRANGE', KEYS[1], ARGV[2], ARGV[1], 'BYLEX', 'REV', 'LIMIT', 0, tonumber(ARGV[4]))
else
  members = redis.call('ZRANGE', KEYS[1], ARGV[1], ARGV[2], 'BYLEX', 'LIMIT', 0, tonumber(ARGV[4]))
end
local rows = {}
for _, member in ipairs(members) do
  local ms, seq = string.match(string.sub(member, -${2 * ID_DIGITS + 1}), '^0*(%d-)%-0*(%d-)$')
  if ms == '' then ms = '0' end
  if seq == '' then seq = '0' end
  local id = ms .. '-' .. seq
  local found = redis.call('XRANGE', KEYS[2], id, id)
  if found[1] then rows[#rows + 1] = found[1] end
end
local last = members[#members]
return { #members, last and string.sub(last, -${2 * ID_DIGITS + 1}) or '', rows }
`;

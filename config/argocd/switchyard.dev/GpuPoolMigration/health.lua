-- Argo CD health check for switchyard.dev/GpuPoolMigration. Argo CD runs it with the object in
-- `obj` and shows the returned status and message on the Application.
--
--   Progressing  the operator has not yet observed the latest spec (observedGeneration < generation,
--                or no status yet), or nodes are still moving
--   Degraded     Stalled=True, BackendOverlap=True (a node served by both backends), or phase Failed
--   Suspended    spec.paused, or phase Paused
--   Healthy      phase Completed or RolledBack, with Ready=True
--
-- Degraded wins over Suspended: a migration that paused itself because a node failed needs a human.

local hs = {}

local function condition(ctype)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == ctype then
      return c
    end
  end
  return nil
end

local function is_true(c)
  return c ~= nil and c.status == "True"
end

local function explain(c, fallback)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    if c.reason ~= nil and c.reason ~= "" then
      return c.reason .. ": " .. c.message
    end
    return c.message
  end
  return fallback
end

local function counts()
  local n = (obj.status and obj.status.nodes) or {}
  local msg = string.format("%d/%d nodes migrated", n.migrated or 0, n.total or 0)
  if (n.inProgress or 0) > 0 then
    msg = msg .. string.format(", %d in progress", n.inProgress)
    local first = obj.status.inProgress and obj.status.inProgress[1]
    if first ~= nil and first.name ~= nil then
      msg = msg .. string.format(" (%s: %s)", first.name, first.state or "?")
    end
  end
  if (n.failed or 0) > 0 then
    msg = msg .. string.format(", %d failed", n.failed)
  end
  if (n.refused or 0) > 0 then
    msg = msg .. string.format(", %d refused", n.refused)
  end
  return msg
end

if obj.status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to report status"
  return hs
end

local generation = obj.metadata and obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.status = "Progressing"
  hs.message = string.format("Waiting for the operator to observe generation %d", generation)
  return hs
end

local phase = obj.status.phase
local overlap = condition("BackendOverlap")
local stalled = condition("Stalled")
local ready = condition("Ready")

if is_true(overlap) then
  hs.status = "Degraded"
  hs.message = explain(overlap, "Nodes are served by the device plugin and DRA at once")
  return hs
end
if is_true(stalled) then
  hs.status = "Degraded"
  hs.message = explain(stalled, "The migration cannot go on without a human") .. " (" .. counts() .. ")"
  return hs
end
if phase == "Failed" then
  hs.status = "Degraded"
  hs.message = explain(ready, "The migration failed") .. " (" .. counts() .. ")"
  return hs
end

if (obj.spec ~= nil and obj.spec.paused == true) or phase == "Paused" then
  hs.status = "Suspended"
  hs.message = "Paused: " .. counts()
  return hs
end

if (phase == "Completed" or phase == "RolledBack") and is_true(ready) then
  hs.status = "Healthy"
  if phase == "Completed" then
    hs.message = "Completed: " .. counts()
  else
    hs.message = string.format("Rolled back: all %d nodes on the device plugin", (obj.status.nodes and obj.status.nodes.total) or 0)
  end
  return hs
end

hs.status = "Progressing"
hs.message = (phase or "Pending") .. ": " .. counts()
return hs

// Looking up an entry of a map by its id, for the models' find() pairs (const and not).
#pragma once

#include <string>

#include "npurt/base/status.h"

namespace npurt::models {

// &map[id] (const as `map` is), or not_found("<name(id)> does not exist").
template <typename Map, typename Name>
auto find_entry(Map& map, const typename Map::key_type& id, Name&& name) -> StatusOr<decltype(&map.begin()->second)> {
  const auto it = map.find(id);
  if (it == map.end()) return not_found(name(id) + " does not exist");
  return &it->second;
}

}  // namespace npurt::models

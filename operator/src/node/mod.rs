//! One node of a pool: the fields the operator caches of it ([`slim`]), its state machine
//! ([`state`]) and what it says of a node yet to start ([`forecast`]), which of its pods a drain
//! moves ([`drain`]) and the canary that verifies a switch ([`canary`]), how its GPU pods are
//! verified once it has migrated ([`verify`]), and the CPU, memory and pod slots a node has and a
//! pod asks for ([`resources`]).

pub mod canary;
pub mod drain;
pub mod forecast;
pub mod patch;
pub mod record;
pub mod resources;
pub mod slim;
pub mod state;
pub mod str_map;
pub mod verify;

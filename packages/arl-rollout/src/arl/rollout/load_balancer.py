"""Routes generation calls to engine replicas: sticky by trajectory, else least in-flight.

A multi-turn trajectory keeps hitting the replica that holds its prefix cache; a new trajectory goes to
the replica with the fewest requests in flight. Stickiness is forgotten when the trajectory releases.
"""

from __future__ import annotations

from collections import OrderedDict


class LoadBalancer:
    def __init__(self, num_replicas: int, max_sticky: int = 100_000) -> None:
        if num_replicas < 1:
            raise ValueError("LoadBalancer needs at least one replica")
        self._in_flight = [0] * num_replicas
        self._sticky: OrderedDict[str, int] = OrderedDict()
        self._max_sticky = max_sticky

    def acquire(self, trajectory_id: str) -> int:
        """Pick a replica for one call of `trajectory_id` and count it in flight."""
        replica = self._sticky.get(trajectory_id)
        if replica is None:
            replica = min(range(len(self._in_flight)), key=self._in_flight.__getitem__)
            self._sticky[trajectory_id] = replica
            if len(self._sticky) > self._max_sticky:  # bound memory if callers never release
                self._sticky.popitem(last=False)
        else:
            self._sticky.move_to_end(trajectory_id)
        self._in_flight[replica] += 1
        return replica

    def release(self, replica: int) -> None:
        """One call on `replica` finished."""
        self._in_flight[replica] -= 1

    def forget(self, trajectory_id: str) -> None:
        """The trajectory is over; drop its stickiness."""
        self._sticky.pop(trajectory_id, None)

    @property
    def in_flight(self) -> list[int]:
        return list(self._in_flight)

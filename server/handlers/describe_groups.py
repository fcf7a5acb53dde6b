"""DescribeGroups: state, protocol and members (with their metadata and assignments) of groups.

Behaviour / version notes:
- v0-6.  An unknown group is reported in state "Dead" (v6+: with GROUP_ID_NOT_FOUND, KIP-1043).
  v3+ authorized operations when asked: everything is allowed for now; v4+ group instance ids.
  Member metadata and the protocol name are shown only while the group is Stable, as Kafka does.
- A group named twice is described once: each repeat of a big group (members' metadata and
  assignments) would add its whole description to the response (clients never repeat one).
"""
from trireme.server.dispatch import handles
from trireme.server.handlers import first_of_each

# READ, DELETE, DESCRIBE
GROUP_OPERATIONS = sum(1 << op for op in (3, 6, 8))


def _describe_groups(ctx, request):
    coordinator = ctx.broker.groups.coordinator
    response = ctx.response()
    gcls = type(response).DescribedGroup
    mcls = gcls.DescribedGroupMember
    for g in coordinator.describe_groups(first_of_each(request.groups), ctx.api_version):
        out = gcls(error_code=g.error, group_id=g.group_id, group_state=g.state,
                   protocol_type=g.protocol_type or "", protocol_data=g.protocol_name or "")
        out.members = [mcls(member_id=m.member_id, group_instance_id=m.group_instance_id,
                            client_id=m.client_id, client_host=m.client_host,
                            member_metadata=m.metadata or b"", member_assignment=m.assignment or b"")
                       for m in g.members]
        if ctx.api_version >= 3 and request.include_authorized_operations:
            out.authorized_operations = GROUP_OPERATIONS
        response.groups.append(out)
    return response


@handles("DescribeGroups", 0, 6)
def describe_groups(ctx, request):
    # Commits answered before this request may still be on their way to disk: wait for them, so a
    # pipelined read sees what was acknowledged (Kafka handles one request per connection at a time).
    return ctx.broker.groups.after_staged_writes(lambda: _describe_groups(ctx, request))

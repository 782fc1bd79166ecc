#include "hostd-a.h"
#include "hostd-b-private.h"
